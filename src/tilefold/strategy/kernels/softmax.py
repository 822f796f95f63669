"""An expert row softmax written directly in LLVM IR: three sweeps over an L1-resident row.

    m = max(x)            (four vector accumulators: the max chain is not latency-bound)
    y = exp(x - m), s = sum(y)   (exp is stored straight into y, no row buffer)
    y *= 1 / s            (one division a row, then multiplies)

Memory sees one read of x and one write of y; the second and third sweeps hit L1 for rows up
to a few thousand floats. Tails are masked, never padded.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.vecmath import MathBuilder, emit_math

UNROLL = 4


def _sweep(b: ir.IRBuilder, n: int, lanes: int, name: str, step, accs: list[ir.Value]):
    """`accs = step(j, mask, accs)` over [0, n) in vectors, unrolled by the number of accs."""
    group = lanes * len(accs)
    full = n - n % group
    if full:
        pre = b.block
        head = b.append_basic_block(f"{name}.head")
        body = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.done")
        b.branch(head)
        b.position_at_end(head)
        j = b.phi(u.i64)
        j.add_incoming(u.const(0), pre)
        phis = [b.phi(a.type) for a in accs]
        for phi, a in zip(phis, accs, strict=True):
            phi.add_incoming(a, pre)
        b.cbranch(b.icmp_signed("<", j, u.const(full)), body, done)
        b.position_at_end(body)
        new = [step(b.add(j, u.const(k * lanes)), None, [phi])[0] for k, phi in enumerate(phis)]
        j.add_incoming(b.add(j, u.const(group)), b.block)
        for phi, a in zip(phis, new, strict=True):
            phi.add_incoming(a, b.block)
        b.branch(head)
        b.position_at_end(done)
        accs = phis
    acc = accs[0]
    for other in accs[1:]:
        acc = step.combine(acc, other)
    for start in range(full, n, lanes):
        mask = None if n - start >= lanes else u.lane_mask(b, u.const(n - start), lanes)
        (acc,) = step(u.const(start), mask, [acc])
    return acc


class _Step:
    """One sweep's loop body; `combine` merges two accumulators."""

    def __init__(self, body, combine):
        self.body = body
        self.combine = combine

    def __call__(self, j, mask, accs):
        return self.body(j, mask, accs)


def emit_softmax_row(b: ir.IRBuilder, x: ir.Value, y: ir.Value, row: ir.Value, n: int,
                     lanes: int) -> None:
    """Softmax of row `row` of the [rows, n] arrays at `x` into `y`."""
    vty = u.vec(u.f32, lanes)
    m = MathBuilder(b, vty)
    base = b.mul(row, u.const(n))

    def ptr(array, j):
        return u.vptr(b, u.gep(b, array, b.add(base, j)), lanes)

    def load(array, j, mask, fill):
        if mask is None:
            return b.load(ptr(array, j), align=4)
        loaded = u.masked_load(b, ptr(array, j), mask, lanes)
        return b.select(mask, loaded, m.c(fill))

    def store(value, j, mask):
        if mask is None:
            b.store(value, ptr(y, j), align=4)
        else:
            u.masked_store(b, value, ptr(y, j), mask)

    def maximum(p, q):
        return m._call("maximum", p, q)

    neg_inf = m.c(float("-inf"))
    acc = _sweep(b, n, lanes, "max", _Step(
        lambda j, mask, accs: [maximum(accs[0], load(x, j, mask, float("-inf")))], maximum),
        [neg_inf] * UNROLL)
    fn = u.intrinsic(b.module, f"llvm.vector.reduce.fmaximum.v{lanes}f32", u.f32, [vty])
    row_max = u.splat(b, b.call(fn, [acc]), lanes)

    def exp_step(j, mask, accs):
        e = emit_math(b, "exp", b.fsub(load(x, j, mask, float("-inf")), row_max))
        store(e, j, mask)
        return [b.fadd(accs[0], e)]

    total = _sweep(b, n, lanes, "exp", _Step(exp_step, b.fadd), [m.c(0.0)] * UNROLL)
    fn = u.intrinsic(b.module, f"llvm.vector.reduce.fadd.v{lanes}f32", u.f32, [u.f32, vty])
    inv = u.splat(b, b.fdiv(ir.Constant(u.f32, 1.0), b.call(fn, [ir.Constant(u.f32, 0.0),
                                                                 total])), lanes)

    def scale_step(j, mask, accs):
        store(b.fmul(load(y, j, mask, 0.0), inv), j, mask)
        return accs

    _sweep(b, n, lanes, "scale", _Step(scale_step, lambda p, q: p), [m.c(0.0)] * UNROLL)
