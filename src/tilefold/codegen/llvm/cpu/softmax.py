"""An expert row softmax written directly in LLVM IR: three sweeps over an L1-resident row.

    m = max(x)            (four vector accumulators: the max chain is not latency-bound)
    e = exp(x - m), s = sum(e)   (x - m <= 0: `exp_nonpositive`, stored into a row on the
                                  thread's stack)
    y = e * (1 / s)       (one division a row, then multiplies)

Memory sees one read of x and one write of y; the second and third sweeps hit L1 for rows up
to a few thousand floats. When y is larger than the last-level cache, its stores bypass the
caches (non-temporal) and the exp sweep prefetches the row `PREFETCH_ROWS` ahead, so memory
stays busy while the row in L1 is computed on (znver3, 5120x2048, 1 thread: 7.6 -> 11.7 GB/s).
Tails are masked, never padded.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.kernel.schedule import PREFETCH_ROWS, vector_lanes
from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.cpu.rowkernel import (
    RowKernel,
    emit_row_kernel,
    load_kernel,
    new_module,
    threads_for,
)
from tilefold.codegen.llvm.memory import store_vector
from tilefold.codegen.llvm.vecmath import MathBuilder
from tilefold.codegen.llvm.vecmath.exp_log import exp_nonpositive
from tilefold.target import Target

UNROLL = 4


def _sweep(b: ir.IRBuilder, n: int, lanes: int, name: str, step, combine,
           accs: list[ir.Value]) -> ir.Value:
    """`accs = step(j, mask, accs)` over [0, n) in vectors, unrolled by the number of accs,
    which `combine(p, q)` then merges into one."""
    group = lanes * len(accs)
    full = n - n % group
    if full:
        with u.for_range_carry(b, 0, full, group, accs, name=name) as loop:
            loop.next = [step(b.add(loop.index, u.const(k * lanes)), None, [phi])[0]
                         for k, phi in enumerate(loop.values)]
        accs = loop.result
    acc = accs[0]
    for other in accs[1:]:
        acc = combine(acc, other)
    for start in range(full, n, lanes):
        mask = None if n - start >= lanes else u.lane_mask(b, u.const(n - start), lanes)
        (acc,) = step(u.const(start), mask, [acc])
    return acc


def emit_softmax_row(b: ir.IRBuilder, x: ir.Value, y: ir.Value, row: ir.Value, n: int,
                     lanes: int, scratch: ir.Value, features: frozenset[str] = frozenset(),
                     streaming: bool = False) -> None:
    """Softmax of row `row` of the [rows, n] arrays at `x` into `y`, through the n floats at
    `scratch` (`features`: the target's, for ISA-specific math forms; `streaming`: y's
    stores bypass the caches and the next rows are prefetched)."""
    vty = u.vec(u.f32, lanes)
    m = MathBuilder(b, vty, features)
    base = b.mul(row, u.const(n))

    def ptr(array, j):
        return u.vptr(b, u.gep(b, array, j), lanes)

    def load(array, j, mask, fill):
        if mask is None:
            return b.load(ptr(array, j), align=4)
        loaded = u.masked_load(b, ptr(array, j), mask, lanes)
        return b.select(mask, loaded, m.c(fill))

    def maximum(p, q):
        return m._call("maximum", p, q)

    row_x = u.gep(b, x, base)
    neg_inf = m.c(float("-inf"))
    acc = _sweep(b, n, lanes, "max",
                 lambda j, mask, accs: [maximum(accs[0], load(row_x, j, mask, float("-inf")))],
                 maximum, [neg_inf] * UNROLL)
    fn = u.intrinsic(b.module, f"llvm.vector.reduce.fmaximum.v{lanes}f32", u.f32, [vty])
    row_max = u.splat(b, b.call(fn, [acc]), lanes)

    def exp_step(j, mask, accs):
        if streaming and mask is None:  # a prefetch never faults, even past the end
            u.prefetch(b, u.gep(b, row_x, b.add(j, u.const(PREFETCH_ROWS * n))))
        e = exp_nonpositive(m, b.fsub(load(row_x, j, mask, float("-inf")), row_max))
        if mask is None:
            b.store(e, ptr(scratch, j), align=4)
        else:
            u.masked_store(b, e, ptr(scratch, j), mask)
        return [b.fadd(accs[0], e)]

    total = _sweep(b, n, lanes, "exp", exp_step, b.fadd, [m.c(0.0)] * UNROLL)
    fn = u.intrinsic(b.module, f"llvm.vector.reduce.fadd.v{lanes}f32", u.f32, [u.f32, vty])
    inv = u.splat(b, b.fdiv(ir.Constant(u.f32, 1.0), b.call(fn, [ir.Constant(u.f32, 0.0),
                                                                 total])), lanes)
    row_y = u.gep(b, y, base)

    def scale_step(j, mask, accs):
        store_vector(b, b.fmul(load(scratch, j, mask, 0.0), inv), u.gep(b, row_y, j), "f32",
                     mask, streaming)
        return accs

    _sweep(b, n, lanes, "scale", scale_step, lambda p, q: p, [m.c(0.0)] * UNROLL)


def softmax_kernel(name: str, rows: int, n: int, target: Target, max_threads: int) -> RowKernel:
    """`name(x, y)`: y = softmax of each of the `rows` rows of n floats of x, for `target`."""
    lanes = vector_lanes(target)
    module = new_module(name, target)
    streaming = 4 * rows * n > target.l3_bytes > 0

    def scratch(b: ir.IRBuilder) -> ir.Value:
        row = b.alloca(ir.ArrayType(u.f32, max(n, 1)), name="exp_row")
        row.align = 64
        return b.bitcast(row, u.f32.as_pointer())

    emit_row_kernel(module, name, 2, rows, threads_for(8 * rows * n, max_threads),
                    lambda b, ptrs, row, st: emit_softmax_row(b, ptrs[0], ptrs[1], row, n, lanes,
                                                             st, target.features, streaming),
                    setup=scratch, streaming=streaming)
    return load_kernel(str(module), target, name, 2)
