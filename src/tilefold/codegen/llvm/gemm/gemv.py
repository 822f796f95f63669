"""Bandwidth-bound matrix-vector products (GEMM with M = 1 or N = 1), in LLVM IR.

y[i] (+)= sum_k W(i, k) x[k] in one of two forms, by which way W is contiguous:
`dot` (rows of W contiguous along k: vector dot products, a row at a time) and
`axpy` (W(i, k) = W[k * ldw + i], contiguous along i: rank-8 updates of y, held in L1).
Both split the outputs i over threads; every load of W is used once, so they run at memory speed.
W and x may hold bf16 or f16 (`src`), widened to f32 as they are loaded: a bf16 weight is half
the bytes of an f32 one (y stays f32).
"""

from __future__ import annotations

import enum

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.gemm.abi import ParamBlock, emit_entry, emit_worker
from tilefold.codegen.llvm.memory import MEMORY_TYPES, load_scalar, load_vector

_FP = u.f32.as_pointer()
GEMV_ENTRY = "tf_gemv"
DOT_VECTORS = 4  # accumulators along k of a dot-form row
AXPY_ROWS = 8
AXPY_VECTORS = 2  # y vectors an axpy step updates together (4 spilled registers on AVX2)


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
    PREFETCH = 9  # f32 elements (4 bytes) ahead of each W load to prefetch (0: the line loaded)
    PANEL = 10  # axpy: outputs per pass over k (N_OUT or more: the thread's share in one)


class GemvMode(enum.IntEnum):
    DOT = 0
    AXPY = 1


def emit_gemv(module: ir.Module, lanes: int, src: str = "f32") -> ir.Function:
    """Add `tf_gemv(params, x, W, y, ws)` for vectors of `lanes` floats, x and W holding `src`
    elements (f32, bf16 or f16)."""
    dot = _emit_dot(module, lanes, src)
    axpy = _emit_axpy(module, lanes, src)
    sp = MEMORY_TYPES[src].as_pointer()
    wk = emit_worker(module, "tf_gemv_worker", sp, sp, _FP)
    b, x, w, y, tid64, nth64 = wk.b, wk.x, wk.y, wk.z, wk.tid, wk.nth
    n_out = wk[GemvParam.N_OUT]
    unit = lanes * 4
    units = b.sdiv(b.add(n_out, u.const(unit - 1)), u.const(unit))
    i0 = u.smin(b, b.mul(b.sdiv(b.mul(units, tid64), nth64), u.const(unit)), n_out)
    i1 = u.smin(b, b.mul(b.sdiv(b.mul(units, b.add(tid64, u.const(1))), nth64), u.const(unit)),
                n_out)
    args = [i0, i1, wk[GemvParam.K], w, wk[GemvParam.LDW], x, wk[GemvParam.INC_X], y,
            wk[GemvParam.INC_Y], b.trunc(wk[GemvParam.BETA], u.i32), wk[GemvParam.PREFETCH],
            wk[GemvParam.PANEL]]
    is_dot = b.icmp_signed("==", wk[GemvParam.MODE], u.const(GemvMode.DOT))
    with b.if_else(is_dot) as (then, other):
        with then:
            b.call(dot, args)
        with other:
            b.call(axpy, args)
    b.ret_void()
    return emit_entry(module, wk.fn, GEMV_ENTRY, GemvParam)


_ARGS = ("i0", "i1", "k", "w", "ldw", "x", "incx", "y", "incy", "beta", "ahead", "panel")


def _new(module, name, src):
    sp = MEMORY_TYPES[src].as_pointer()
    types = [u.i64, u.i64, u.i64, sp, u.i64, sp, u.i64, _FP, u.i64, u.i32, u.i64, u.i64]
    fn = ir.Function(module, ir.FunctionType(u.void, types), name=name)
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


def _grouped_stop(b, start, stop, span):
    """End of the whole `span`s of [start, stop)."""
    return b.sub(stop, b.srem(b.sub(stop, start), u.const(span)))


def _full_and_tail(b, start, stop, lanes, body, group=1):
    """`body(index, mask, vectors)` over [start, stop) in vectors of `lanes`: unmasked full
    vectors (mask None; plain loads, which masked ones cost several times on AVX2), `group`
    a call, then single ones, then one masked tail vector if any lanes are left."""
    grouped_stop = _grouped_stop(b, start, stop, lanes * group)
    with u.for_range(b, start, grouped_stop, lanes * group, "vg") as i:
        body(i, None, group)
    if group > 1:
        full_stop = _grouped_stop(b, start, stop, lanes)
        with u.for_range(b, grouped_stop, full_stop, lanes, "v") as i:
            body(i, None, 1)
    else:
        full_stop = grouped_stop
    with b.if_then(b.icmp_signed("<", full_stop, stop)):
        body(full_stop, u.lane_mask(b, b.sub(stop, full_stop), lanes), 1)


def _bf16_pairs(b, ptr, lanes):
    """2 * `lanes` bf16 at `ptr` as f32 (even elements, odd elements): one load of i32 pairs,
    then a shift (the low halves, elements 2j) and a mask (the high halves, 2j + 1) instead
    of a widening shuffle and a shift for every `lanes` of them."""
    i32s = u.vec(u.i32, lanes)
    v = b.load(b.bitcast(ptr, i32s.as_pointer()), align=2)
    f32s = u.vec(u.f32, lanes)
    even = b.shl(v, ir.Constant(i32s, [16] * lanes))
    odd = b.and_(v, ir.Constant(i32s, [-(1 << 16)] * lanes))
    return b.bitcast(even, f32s), b.bitcast(odd, f32s)


def _permute_pairs(b, y, start, stop, lanes, split):
    """Each whole 2 * `lanes` of y[start:stop] as (even elements, odd elements) (`split`), or
    back to the order they belong in."""
    idx = (list(range(0, 2 * lanes, 2)) + list(range(1, 2 * lanes, 2)) if split else
           [j // 2 + (j % 2) * lanes for j in range(2 * lanes)])
    with u.for_range(b, start, _grouped_stop(b, start, stop, 2 * lanes), 2 * lanes,
                     "py") as i:
        ptrs = [u.vptr(b, u.gep(b, y, b.add(i, u.const(h * lanes))), lanes) for h in (0, 1)]
        lo, hi = (b.load(p, align=4) for p in ptrs)
        for h, p in enumerate(ptrs):
            mask = ir.Constant(u.vec(u.i32, lanes), idx[h * lanes:(h + 1) * lanes])
            b.store(b.shuffle_vector(lo, hi, mask), p, align=4)


def _ahead(b, ptr, ahead):
    """Prefetch the line `ahead` * 4 bytes past `ptr` (an address past W is never touched)."""
    p8 = b.bitcast(ptr, u.i8.as_pointer())
    u.prefetch(b, b.gep(p8, [b.mul(ahead, u.const(4))]))


def _load(b, ptr, mask, lanes):
    vp = u.vptr(b, ptr, lanes)
    return b.load(vp, align=4) if mask is None else u.masked_load(b, vp, mask, lanes)


def _load_src(b, ptr, mask, lanes, src):
    """`lanes` elements of x or W widened to f32; masked-off lanes are 0."""
    if src == "f32":
        return _load(b, ptr, mask, lanes)
    v = load_vector(b, ptr, src, lanes, mask)
    return v if mask is None else b.select(mask, v, u.zeros(v.type))


def _store(b, value, ptr, mask, lanes):
    vp = u.vptr(b, ptr, lanes)
    if mask is None:
        b.store(value, vp, align=4)
    else:
        u.masked_store(b, value, vp, mask)


def _emit_dot(module, lanes, src):
    """Rows i of W contiguous along k (W(i, k) = W[i * ldw + k]); x must be contiguous.

    One row at a time, so W is read as one sequential stream (its prefetches run on into the
    next row), with DOT_VECTORS accumulators along k to hide the FMA latency where W is in cache.
    Interleaving rows instead (four streams sharing each load of x) halved the DRAM bandwidth
    on znver4 for rows of a few KiB: 14 against 30 GB/s at 1 thread on a 576 x 49152 head."""
    fn, b = _new(module, "tf_gemv_dot", src)
    i0, i1, k, w, ldw, x, _incx, y, incy, beta, ahead, _panel = fn.args
    zero = u.zeros(u.vec(u.f32, lanes))
    span = lanes * DOT_VECTORS
    grouped_k = b.sub(k, b.srem(k, u.const(span)))
    full_k = b.sub(k, b.srem(k, u.const(lanes)))
    with u.for_range(b, i0, i1, 1, "i") as i:
        row = u.gep(b, w, b.mul(i, ldw))

        def step(kv, mask, acc):
            xv = _load_src(b, u.gep(b, x, kv), mask, lanes, src)
            return u.fma(b, _load_src(b, u.gep(b, row, kv), mask, lanes, src), xv, acc)

        with u.for_range_carry(b, u.const(0), grouped_k, span, [zero] * DOT_VECTORS,
                               "kg") as lp:
            at = [b.add(lp.index, u.const(v * lanes)) for v in range(DOT_VECTORS)]
            for kv in at:
                _ahead(b, u.gep(b, row, kv), ahead)
            lp.next = [step(kv, None, acc) for kv, acc in zip(at, lp.values, strict=True)]
        accs = lp.result
        with u.for_range_carry(b, grouped_k, full_k, lanes, [accs[0]], "kv") as lp:
            lp.next = [step(lp.index, None, lp.values[0])]
        acc = lp.result[0]
        tail = u.lane_mask(b, b.sub(k, full_k), lanes)
        acc = step(full_k, tail, acc)  # an all-false mask loads nothing
        for other in accs[1:]:
            acc = b.fadd(acc, other)
        _finish(b, _hsum(b, acc), u.gep(b, y, b.mul(i, incy)), beta)
    b.ret_void()
    return fn


def _emit_axpy(module, lanes, src):
    """W(i, k) = W[k * ldw + i], contiguous along i; y must be contiguous (incy = 1).

    Rank-AXPY_ROWS updates of y (rank-1 for the last k % AXPY_ROWS rows): each pass reads its
    rows of W as sequential streams (the hardware prefetcher's best case) and y, this thread's
    slice, stays in L1 between passes."""
    fn, b = _new(module, "tf_gemv_axpy", src)
    arg = dict(zip(_ARGS, fn.args, strict=True))
    keep_y = b.icmp_signed("!=", arg["beta"], u.const(0, u.i32))
    with u.for_range(b, arg["i0"], arg["i1"], arg["panel"], "p") as p0:
        p1 = u.smin(b, b.add(p0, arg["panel"]), arg["i1"])
        _axpy_panel(b, p0, p1, arg, keep_y, lanes, src)
    b.ret_void()
    return fn


def _axpy_panel(b, p0, p1, arg, keep_y, lanes, src):
    """y[p0:p1] (+)= sum over all k of W(p0:p1, k) x[k].

    bf16 W is read as pairs (`_bf16_pairs`) where a step covers two vectors: those steps keep
    their part of y split into even and odd elements while they run, put back after."""
    k, w, ldw, x, incx, y, ahead = (arg[n] for n in ("k", "w", "ldw", "x", "incx", "y", "ahead"))
    zero = u.zeros(u.vec(u.f32, lanes))
    pairs = src == "bf16" and AXPY_VECTORS == 2
    if pairs:
        with b.if_then(keep_y):
            _permute_pairs(b, y, p0, p1, lanes, split=True)
    with u.for_chunks(b, u.const(0), k, (AXPY_ROWS, 1), "kb") as (kb, count):
        read_y = b.or_(keep_y, b.icmp_signed(">", kb, u.const(0)))
        full = b.icmp_signed("==", count, u.const(AXPY_ROWS))
        with b.if_else(full) as (block, single):
            for rows, branch in ((AXPY_ROWS, block), (1, single)):
                with branch:
                    ks = [b.add(kb, u.const(t)) for t in range(rows)]
                    xs = [u.splat(b, load_scalar(b, u.gep(b, x, b.mul(kt, incx)), src), lanes)
                          for kt in ks]
                    row_ptrs = [u.gep(b, w, b.mul(kt, ldw)) for kt in ks]

                    def update(i, mask, vectors, xs=xs, row_ptrs=row_ptrs):
                        """y[i : i + vectors * lanes]: one accumulator a vector, the rows'
                        FMAs interleaved across them (a single vector's chain of dependent
                        FMAs left the loop at the FMA latency), W prefetched once a step."""
                        at = [b.add(i, u.const(v * lanes)) for v in range(vectors)]
                        yps = [u.gep(b, y, j) for j in at]
                        accs = [b.select(read_y, _load(b, yp, mask, lanes), zero) for yp in yps]
                        for xt, row in zip(xs, row_ptrs, strict=True):
                            if mask is None:
                                _ahead(b, u.gep(b, row, i), ahead)
                            if pairs and vectors == 2:
                                ws = _bf16_pairs(b, u.gep(b, row, i), lanes)
                            else:
                                ws = [_load_src(b, u.gep(b, row, j), mask, lanes, src)
                                      for j in at]
                            accs = [u.fma(b, wv, xt, acc)
                                    for wv, acc in zip(ws, accs, strict=True)]
                        for acc, yp in zip(accs, yps, strict=True):
                            _store(b, acc, yp, mask, lanes)

                    _full_and_tail(b, p0, p1, lanes, update, AXPY_VECTORS)
    if pairs:
        _permute_pairs(b, y, p0, p1, lanes, split=False)
