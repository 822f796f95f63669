"""Bandwidth-bound matrix-vector products (GEMM with M = 1 or N = 1), in LLVM IR.

y[i] (+)= sum_k W(i, k) x[k] in one of two forms, by which way W is contiguous:
`dot` (rows of W contiguous along k: vector dot products, four rows sharing each x load) and
`axpy` (W(i, k) = W[k * ldw + i], contiguous along i: rank-8 updates of y, held in L1).
Both split the outputs i over threads; every load of W is used once, so they run at memory speed.
"""

from __future__ import annotations

import enum

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.gemm.abi import ParamBlock, emit_entry, emit_worker

_FP = u.f32.as_pointer()
GEMV_ENTRY = "tf_gemv"
DOT_ROWS = 4
AXPY_ROWS = 8


class GemvParam(ParamBlock):
    """Slots of the int64 parameter block of `tf_gemv`."""

    N_OUT = 0
    K = 1
    LDW = 2
    INC_X = 3
    INC_Y = 4
    BETA = 5
    THREADS = 6
    MODE = 7
    DATA_OFFSET = 8


class GemvMode(enum.IntEnum):
    DOT = 0
    AXPY = 1


def emit_gemv(module: ir.Module, lanes: int) -> ir.Function:
    """Add `tf_gemv(params, x, W, y, ws)` for vectors of `lanes` floats."""
    dot = _emit_dot(module, lanes)
    axpy = _emit_axpy(module, lanes)
    wk = emit_worker(module, "tf_gemv_worker", _FP, _FP, _FP)
    b, x, w, y, tid64, nth64 = wk.b, wk.x, wk.y, wk.z, wk.tid, wk.nth
    n_out = wk[GemvParam.N_OUT]
    unit = lanes * 4
    units = b.sdiv(b.add(n_out, u.const(unit - 1)), u.const(unit))
    i0 = u.smin(b, b.mul(b.sdiv(b.mul(units, tid64), nth64), u.const(unit)), n_out)
    i1 = u.smin(b, b.mul(b.sdiv(b.mul(units, b.add(tid64, u.const(1))), nth64), u.const(unit)),
                n_out)
    args = [i0, i1, wk[GemvParam.K], w, wk[GemvParam.LDW], x, wk[GemvParam.INC_X], y,
            wk[GemvParam.INC_Y], b.trunc(wk[GemvParam.BETA], u.i32)]
    is_dot = b.icmp_signed("==", wk[GemvParam.MODE], u.const(GemvMode.DOT))
    with b.if_else(is_dot) as (then, other):
        with then:
            b.call(dot, args)
        with other:
            b.call(axpy, args)
    b.ret_void()
    return emit_entry(module, wk.fn, GEMV_ENTRY, GemvParam)


_ARGS = ("i0", "i1", "k", "w", "ldw", "x", "incx", "y", "incy", "beta")
_TYPES = [u.i64, u.i64, u.i64, _FP, u.i64, _FP, u.i64, _FP, u.i64, u.i32]


def _new(module, name):
    fn = ir.Function(module, ir.FunctionType(u.void, _TYPES), name=name)
    fn.linkage = "internal"
    for arg, n in zip(fn.args, _ARGS, strict=True):
        arg.name = n
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _finish(b, acc, ptr, beta):
    """y = acc (beta 0: y is never read) or y + acc."""
    keep = b.icmp_signed("!=", beta, u.const(0, u.i32))
    with b.if_then(keep):
        b.store(b.fadd(b.load(ptr, align=4), acc), ptr, align=4)
    with b.if_then(b.not_(keep)):
        b.store(acc, ptr, align=4)


def _hsum(b, v):
    fn = u.intrinsic(b.module, f"llvm.vector.reduce.fadd.v{v.type.count}f32", u.f32,
                     [u.f32, v.type])
    return b.call(fn, [ir.Constant(u.f32, 0.0), v], fastmath=("reassoc",))


def _emit_dot(module, lanes):
    """Rows i of W contiguous along k (W(i, k) = W[i * ldw + k]); x must be contiguous."""
    fn, b = _new(module, "tf_gemv_dot")
    i0, i1, k, w, ldw, x, _incx, y, incy, beta = fn.args
    zero = u.zeros(u.vec(u.f32, lanes))
    with u.for_chunks(b, i0, i1, (DOT_ROWS, 1), "i") as (i, rows):
        four = b.icmp_signed("==", rows, u.const(DOT_ROWS))
        with b.if_else(four) as (block, single):
            for count, branch in ((DOT_ROWS, block), (1, single)):
                with branch:
                    ptrs = [u.gep(b, w, b.mul(b.add(i, u.const(r)), ldw)) for r in range(count)]
                    with u.for_range_carry(b, u.const(0), k, lanes, [zero] * count, "kv") as lp:
                        kv = lp.index
                        mask = u.lane_mask(b, u.smin(b, b.sub(k, kv), u.const(lanes)), lanes)
                        xv = u.masked_load(b, u.vptr(b, u.gep(b, x, kv), lanes), mask, lanes)
                        lp.next = [
                            u.fma(b, u.masked_load(b, u.vptr(b, u.gep(b, ptr, kv), lanes), mask,
                                                   lanes), xv, acc)
                            for ptr, acc in zip(ptrs, lp.values, strict=True)]
                    for r, acc in enumerate(lp.result):
                        out = u.gep(b, y, b.mul(b.add(i, u.const(r)), incy))
                        _finish(b, _hsum(b, acc), out, beta)
    b.ret_void()
    return fn


def _emit_axpy(module, lanes):
    """W(i, k) = W[k * ldw + i], contiguous along i; y must be contiguous (incy = 1).

    Rank-AXPY_ROWS updates of y: each pass reads AXPY_ROWS rows of W as sequential streams (the
    hardware prefetcher's best case) and y, this thread's slice, stays in L1 between passes."""
    fn, b = _new(module, "tf_gemv_axpy")
    i0, i1, k, w, ldw, x, incx, y, _incy, beta = fn.args
    rows = AXPY_ROWS
    keep_y = b.icmp_signed("!=", beta, u.const(0, u.i32))
    with u.for_range(b, u.const(0), k, rows, "kb") as kb:
        count = u.smin(b, u.const(rows), b.sub(k, kb))
        valid = [b.icmp_signed("<", u.const(t), count) for t in range(rows)]
        safe = [b.select(valid[t], b.add(kb, u.const(t)), kb) for t in range(rows)]
        zero = ir.Constant(u.f32, 0.0)
        xs = [u.splat(b, b.select(valid[t], b.load(u.gep(b, x, b.mul(safe[t], incx)), align=4),
                                  zero), lanes) for t in range(rows)]
        row_ptrs = [u.gep(b, w, b.mul(safe[t], ldw)) for t in range(rows)]
        read_y = u.splat(b, b.or_(keep_y, b.icmp_signed(">", kb, u.const(0))), lanes)
        with u.for_range(b, i0, i1, lanes, "i") as i:
            mask = u.lane_mask(b, u.smin(b, b.sub(i1, i), u.const(lanes)), lanes)
            yp = u.vptr(b, u.gep(b, y, i), lanes)
            acc = u.masked_load(b, yp, b.and_(mask, read_y), lanes)
            for t in range(rows):
                row_mask = b.and_(mask, u.splat(b, valid[t], lanes))
                wv = u.masked_load(b, u.vptr(b, u.gep(b, row_ptrs[t], i), lanes), row_mask,
                                   lanes)
                acc = u.fma(b, wv, xs[t], acc)
            u.masked_store(b, acc, yp, mask)
    b.ret_void()
    return fn
