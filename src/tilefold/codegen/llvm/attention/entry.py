"""The native entry both attention kernels share: array objects in, a context of i64 slots out.

`name(q, k, v, [mask], out, [lse], float scale)` takes rank-4 NumPy array objects (lse, one
log-sum-exp per query row, with a trailing dim of 1), reads their data pointers, dims and
strides (`arrays.py`) into the slots below, and runs the worker on the native pool (or inline
for one thread). A size-1 dim reads with stride 0 (it broadcasts).
Slots from `SLOTS` on are the worker's own (`extra`): the decode kernel's threads publish
their partial results there.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.gemm.abi import PARALLEL_TYPE, WORKER_TYPE
from tilefold.runtime.arrays import DATA_OFFSET, DIMS_OFFSET, STRIDES_OFFSET

PTRS = 5  # q, k, v, mask, out
B, H, L, HK, S = range(PTRS, PTRS + 5)  # out's batch, heads, rows; k's heads, keys
Q_STRIDES, K_STRIDES, V_STRIDES, M_STRIDES, O_STRIDES = 10, 14, 18, 22, 26  # b, h, row, col
SCALE = 30
LSE, LSE_STRIDES = 31, 32  # the log-sum-exp output (0 where the kernel gives none)
SLOTS = 36


def emit_entry(module: ir.Module, name: str, mask: str, threads: int, worker: ir.Function,
               extra: int = 0, lse: bool = False) -> None:
    """Define `name`, filling a context of `SLOTS + extra` slots for `worker(ctx, tid, n)`."""
    i8p = u.i8.as_pointer()
    names = [n for n in ("q", "k", "v", "mask", "out", "lse")
             if (n != "mask" or mask != "none") and (n != "lse" or lse)]
    fn = ir.Function(module, ir.FunctionType(u.void, [i8p] * len(names) + [u.f32]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = b.alloca(ir.ArrayType(u.i64, SLOTS + extra), name="ctx")
    slots = b.bitcast(ctx, u.i64.as_pointer())
    objs = dict(zip(names, fn.args, strict=False))

    def put(slot: int, value) -> None:
        b.store(value, u.gep(b, slots, slot))

    fields = {key: read_array(b, obj, 1 if key == "mask" and mask == "bool" else 4)
              for key, obj in objs.items()}
    for slot, key in enumerate(("q", "k", "v", "mask", "out")):
        put(slot, fields[key][0] if key in fields else u.const(0))
    out_dims, k_dims = fields["out"][1], fields["k"][1]
    for slot, value in ((B, out_dims[0]), (H, out_dims[1]), (L, out_dims[2]), (HK, k_dims[1]),
                        (S, k_dims[2])):
        put(slot, value)
    put(LSE, fields["lse"][0] if "lse" in fields else u.const(0))
    for base, key in ((Q_STRIDES, "q"), (K_STRIDES, "k"), (V_STRIDES, "v"),
                      (M_STRIDES, "mask"), (O_STRIDES, "out"), (LSE_STRIDES, "lse")):
        if key in fields:
            for i, s in enumerate(fields[key][2]):
                put(base + i, s)
    put(SCALE, b.zext(b.bitcast(fn.args[-1], u.i32), u.i64))
    run_worker(b, worker, b.bitcast(ctx, i8p), threads)
    b.ret_void()


def read_array(b: ir.IRBuilder, obj: ir.Value, itemsize: int
               ) -> tuple[ir.Value, list[ir.Value], list[ir.Value]]:
    """(data pointer as an i64, dims, element strides) of a rank-4 NumPy array object; a
    size-1 dim reads with stride 0 (it broadcasts)."""
    def field(offset: int, ty: ir.Type):
        return b.load(b.bitcast(b.gep(obj, [u.const(offset)]), ty.as_pointer()))

    dims_at, strides_at = field(DIMS_OFFSET, u.i64.as_pointer()), field(STRIDES_OFFSET,
                                                                        u.i64.as_pointer())
    dims = [b.load(u.gep(b, dims_at, i)) for i in range(4)]
    strides = [b.select(b.icmp_signed("==", dims[i], u.const(1)), u.const(0),
                        b.sdiv(b.load(u.gep(b, strides_at, i)), u.const(itemsize)))
               for i in range(4)]
    return field(DATA_OFFSET, u.i64), dims, strides


def run_worker(b: ir.IRBuilder, worker: ir.Function, ctx: ir.Value, threads: int) -> None:
    """`worker(ctx, tid, n)` on the native pool's `threads` threads, or inline for one."""
    if threads > 1:
        par = u.intrinsic(b.module, "tilefold_parallel", u.void, list(PARALLEL_TYPE.args))
        b.call(par, [worker, ctx, u.const(threads, u.i32)])
    else:
        b.call(worker, [ctx, u.const(0, u.i32), u.const(1, u.i32)])


def begin_worker(module: ir.Module, name: str, slots: int
                 ) -> tuple[ir.Function, ir.IRBuilder, dict[int, ir.Value]]:
    """An internal `name(ctx, tid, nthreads)`, its builder at the entry and the context's first
    `slots` slots loaded there (by index)."""
    fn = ir.Function(module, WORKER_TYPE, name=name)
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = b.bitcast(fn.args[0], u.i64.as_pointer())
    return fn, b, {i: b.load(u.gep(b, ctx, i), name=f"s{i}") for i in range(slots)}
