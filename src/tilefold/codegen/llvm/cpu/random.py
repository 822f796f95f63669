"""The `random_uniform` kernel: the counter hash of `ir/ops/random.py` in SIMD lanes.

A row kernel (`rowkernel.emit_row_kernel`) whose rows are blocks of BLOCK numbers, split over
the threads: each block is a loop over vectors of consecutive counters (8 lanes of 32 bits on
AVX2, 16 on AVX-512): `lo ^ k0`, the lowbias32 mix, `+ (k1 ^ hi * GOLDEN)`, the mix again,
the top 24 bits to float times 2**-24, stored; the output's last partial vector is stored
under a lane mask. The keys come from the seed (read at run time) and the stream (a constant
of the code), as `keys()` makes them, so the kernel and the reference agree bit for bit. A
vector never straddles a 2**32 boundary of the counter (the lane count divides 2**32), so
`hi` is one scalar per vector.

`name(seed, out, count, sizes)` takes NumPy array objects (data pointers read natively): the
0-d i64 seed, the f32 output, an int64 array holding the element count, and the row kernel's
int64 [blocks, threads].
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.cpu.rowkernel import GENERATORS, RowKernel, emit_row_kernel, threads_for
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


BLOCK = 4096  # numbers a row of the kernel draws: 16 KiB of output


def random_ir(name: str, stream: int, lanes: int, triple: str) -> str:
    """The kernel's LLVM IR for draw `stream`, `lanes` counters a vector."""
    module = ir.Module(name=name)
    module.triple = triple
    vty = u.vec(u.i32, lanes)

    def scalar(v: int) -> ir.Constant:
        return u.const(v & 0xFFFFFFFF, u.i32)

    def vector(v: int) -> ir.Constant:
        return ir.Constant(vty, [v & 0xFFFFFFFF] * lanes)

    def block(b: ir.IRBuilder, ptrs: list[ir.Value], row: ir.Value, state: None) -> None:
        seed = b.load(b.bitcast(ptrs[0], u.i64.as_pointer()))
        out = b.bitcast(ptrs[1], u.f32.as_pointer())
        n = b.load(b.bitcast(ptrs[2], u.i64.as_pointer()))
        k0 = _mix(b, b.xor(b.trunc(seed, u.i32), scalar(mix(stream * GOLDEN + 1))), scalar)
        k1 = _mix(b, b.add(b.trunc(b.lshr(seed, u.const(32)), u.i32), k0), scalar)
        k0v = u.splat(b, k0, lanes)
        iota = ir.Constant(vty, list(range(lanes)))
        scale = ir.Constant(u.vec(u.f32, lanes), [2.0**-24] * lanes)
        first = b.mul(row, u.const(BLOCK))
        with u.for_range(b, first, u.smin(b, n, b.add(first, u.const(BLOCK))), lanes) as i:
            hi = b.trunc(b.lshr(i, u.const(32)), u.i32)
            counters = b.add(u.splat(b, b.trunc(i, u.i32), lanes), iota)
            x = _mix(b, b.xor(counters, k0v), vector)
            x = b.add(x, u.splat(b, b.xor(k1, b.mul(hi, scalar(GOLDEN))), lanes))
            x = _mix(b, x, vector)
            values = b.fmul(b.uitofp(b.lshr(x, vector(8)), u.vec(u.f32, lanes)), scale)
            at = u.vptr(b, u.gep(b, out, i), lanes)
            left = b.sub(n, i)
            with b.if_else(b.icmp_signed(">=", left, u.const(lanes))) as (whole, part):
                with whole:
                    b.store(values, at, align=4)
                with part:
                    u.masked_store(b, values, at, u.lane_mask(b, left, lanes))

    emit_row_kernel(module, name, 3, None, None, block)
    return str(module)


def random_kernel(n: int, stream: int, threads: int, target: Target) -> RowKernel:
    """The compiled kernel for `n` numbers of draw `stream` on up to `threads` threads (the
    code serves every n; cached on disk by its source, stream and lanes)."""
    lanes = max(4, target.vector_bits // 32)
    key = f"{source_digest(*GENERATORS, __name__, 'tilefold.ir.ops.random')}|{stream}|{lanes}"
    name = f"tf_random_{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def make_ir() -> str:
        return random_ir(name, stream, lanes, target.triple)

    compiled = compile_generated(f"{key}|{name}", make_ir, target, name=name, uses_pool=True)
    fn = compiled.function(name, None, *([ctypes.py_object] * 4))
    blocks = -(-n // BLOCK)
    sizes = np.array([blocks, threads_for(4 * n, threads)], np.int64)
    return RowKernel(fn, make_ir, lambda: emit_assembly(make_ir(), target),
                     (np.array([n], np.int64), sizes))
