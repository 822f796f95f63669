"""The native entry both attention kernels share: array objects in, a context of i64 slots out.

`name(q, k, v, [mask], out, float scale)` takes rank-4 NumPy array objects, reads their data
pointers, dims and strides (`arrays.py`) into the slots below, and runs the worker on the
native pool (or inline for one thread). A size-1 dim reads with stride 0 (it broadcasts).
Slots from `SLOTS` on are the worker's own (`extra`): the decode kernel's threads publish
their partial results there.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.gemm.abi import PARALLEL_TYPE
from tilefold.runtime.arrays import DATA_OFFSET, DIMS_OFFSET, STRIDES_OFFSET

PTRS = 5  # q, k, v, mask, out
B, H, L, HK, S = range(PTRS, PTRS + 5)  # out's batch, heads, rows; k's heads, keys
Q_STRIDES, K_STRIDES, V_STRIDES, M_STRIDES, O_STRIDES = 10, 14, 18, 22, 26  # b, h, row, col
SCALE = 30
SLOTS = 31


def emit_entry(module: ir.Module, name: str, mask: str, threads: int, worker: ir.Function,
               extra: int = 0) -> None:
    """Define `name`, filling a context of `SLOTS + extra` slots for `worker(ctx, tid, n)`."""
    i8p = u.i8.as_pointer()
    nobj = 5 if mask != "none" else 4
    fn = ir.Function(module, ir.FunctionType(u.void, [i8p] * nobj + [u.f32]), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = b.alloca(ir.ArrayType(u.i64, SLOTS + extra), name="ctx")
    slots = b.bitcast(ctx, u.i64.as_pointer())
    objs = dict(zip(("q", "k", "v", "mask", "out") if nobj == 5 else ("q", "k", "v", "out"),
                    fn.args, strict=False))

    def field(obj, offset: int, ty: ir.Type):
        return b.load(b.bitcast(b.gep(obj, [u.const(offset)]), ty.as_pointer()))

    def put(slot: int, value) -> None:
        b.store(value, u.gep(b, slots, slot))

    def dims(obj):
        p = field(obj, DIMS_OFFSET, u.i64.as_pointer())
        return [b.load(u.gep(b, p, i)) for i in range(4)]

    def strides(obj, itemsize: int):
        """Element strides; a size-1 dim broadcasts (stride 0)."""
        p = field(obj, STRIDES_OFFSET, u.i64.as_pointer())
        sizes = dims(obj)
        return [b.select(b.icmp_signed("==", sizes[i], u.const(1)), u.const(0),
                         b.sdiv(b.load(u.gep(b, p, i)), u.const(itemsize))) for i in range(4)]

    for slot, key in enumerate(("q", "k", "v", "mask", "out")):
        put(slot, field(objs[key], DATA_OFFSET, u.i64) if key in objs else u.const(0))
    out_dims, k_dims = dims(objs["out"]), dims(objs["k"])
    for slot, value in ((B, out_dims[0]), (H, out_dims[1]), (L, out_dims[2]), (HK, k_dims[1]),
                        (S, k_dims[2])):
        put(slot, value)
    for base, key, itemsize in ((Q_STRIDES, "q", 4), (K_STRIDES, "k", 4), (V_STRIDES, "v", 4),
                                (M_STRIDES, "mask", 1 if mask == "bool" else 4),
                                (O_STRIDES, "out", 4)):
        if key in objs:
            for i, s in enumerate(strides(objs[key], itemsize)):
                put(base + i, s)
    put(SCALE, b.zext(b.bitcast(fn.args[-1], u.i32), u.i64))
    ctx8 = b.bitcast(ctx, i8p)
    if threads > 1:
        par = u.intrinsic(module, "tilefold_parallel", u.void, list(PARALLEL_TYPE.args))
        b.call(par, [worker, ctx8, u.const(threads, u.i32)])
    else:
        b.call(worker, [ctx8, u.const(0, u.i32), u.const(1, u.i32)])
    b.ret_void()
