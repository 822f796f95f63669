"""The `random_uniform` kernel: the counter hash of `ir/ops/random.py` in SIMD lanes.

One loop over the output, a vector of consecutive counters at a time (8 lanes of 32 bits on
AVX2, 16 on AVX-512): `lo ^ k0`, the lowbias32 mix, `+ (k1 ^ hi * GOLDEN)`, the mix again, the
top 24 bits to float times 2**-24, stored; the last partial vector is stored under a lane
mask. The keys come from the seed (read at run time) and the stream (a constant of the code),
as `keys()` makes them, so the kernel and the reference agree bit for bit. A vector never
straddles a 2**32 boundary of the counter (the lane count divides 2**32), so `hi` is one
scalar per vector.

`name(seed, out, sizes)` takes NumPy array objects (data pointers read natively, as row
kernels do): the 0-d i64 seed, the f32 output, and an int64 array holding the element count.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.cpu.rowkernel import RowKernel
from tilefold.codegen.gemm.abi import DATA_OFFSET
from tilefold.errors import UnsupportedError
from tilefold.ir.ops.random import GOLDEN, MIX, mix
from tilefold.runtime import compile_generated, emit_assembly, source_digest
from tilefold.target import Target


def _mix(b: ir.IRBuilder, x: ir.Value, const: Callable) -> ir.Value:
    """lowbias32 on an i32 or a vector of them (`const(value)` makes a constant of x's type)."""
    s0, m0, s1, m1, s2 = MIX
    x = b.xor(x, b.lshr(x, const(s0)))
    x = b.mul(x, const(m0))
    x = b.xor(x, b.lshr(x, const(s1)))
    x = b.mul(x, const(m1))
    return b.xor(x, b.lshr(x, const(s2)))


def random_ir(name: str, stream: int, lanes: int, triple: str) -> str:
    """The kernel's LLVM IR for draw `stream`, `lanes` counters a vector."""
    module = ir.Module(name=name)
    module.triple = triple
    i8p = u.i8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(u.void, [i8p] * 3), name=name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    seed_p, out_p, sizes_p = (
        b.inttoptr(b.load(b.bitcast(b.gep(obj, [u.const(DATA_OFFSET)]), u.i64.as_pointer())),
                   ty.as_pointer())
        for obj, ty in zip(fn.args, (u.i64, u.f32, u.i64), strict=True))
    seed, n = b.load(seed_p), b.load(sizes_p)

    def scalar(v: int) -> ir.Constant:
        return u.const(v & 0xFFFFFFFF, u.i32)

    vty = u.vec(u.i32, lanes)

    def vector(v: int) -> ir.Constant:
        return ir.Constant(vty, [v & 0xFFFFFFFF] * lanes)

    k0 = _mix(b, b.xor(b.trunc(seed, u.i32), scalar(mix(stream * GOLDEN + 1))), scalar)
    k1 = _mix(b, b.add(b.trunc(b.lshr(seed, u.const(32)), u.i32), k0), scalar)
    k0v = u.splat(b, k0, lanes)
    iota = ir.Constant(vty, list(range(lanes)))
    scale = ir.Constant(u.vec(u.f32, lanes), [2.0**-24] * lanes)
    with u.for_range(b, 0, n, lanes, name="i") as i:
        hi = b.trunc(b.lshr(i, u.const(32)), u.i32)
        counters = b.add(u.splat(b, b.trunc(i, u.i32), lanes), iota)
        x = _mix(b, b.xor(counters, k0v), vector)
        x = b.add(x, u.splat(b, b.xor(k1, b.mul(hi, scalar(GOLDEN))), lanes))
        x = _mix(b, x, vector)
        values = b.fmul(b.uitofp(b.lshr(x, vector(8)), u.vec(u.f32, lanes)), scale)
        at = u.vptr(b, u.gep(b, out_p, i), lanes)
        left = b.sub(n, i)
        whole = b.icmp_signed(">=", left, u.const(lanes))
        with b.if_else(whole) as (then, otherwise):
            with then:
                b.store(values, at, align=4)
            with otherwise:
                u.masked_store(b, values, at, u.lane_mask(b, left, lanes))
    b.ret_void()
    return str(module)


def random_kernel(n: int, stream: int, target: Target) -> RowKernel:
    """The compiled kernel for `n` numbers of draw `stream` (the code serves every n; cached
    on disk by its source and lanes)."""
    if DATA_OFFSET < 0:
        raise UnsupportedError("this Python keeps NumPy data pointers where tilefold cannot "
                               "read them; native kernels are unavailable (extern still works)")
    lanes = max(4, target.vector_bits // 32)
    key = f"{source_digest(__name__, 'tilefold.ir.ops.random')}|{stream}|{lanes}"
    name = f"tf_random_{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def make_ir() -> str:
        return random_ir(name, stream, lanes, target.triple)

    compiled = compile_generated(f"{key}|{name}", make_ir, target, name=name)
    fn = compiled.function(name, None, *([ctypes.py_object] * 3))
    sizes = np.array([n], np.int64)
    return RowKernel(fn, make_ir, lambda: emit_assembly(make_ir(), target), (sizes,))
