"""The AMX low-precision GEMM module in LLVM IR: 16 x 32 blocks of C as two accumulator tiles.

`tf_amxgemm(params, A, B, C, ws)` computes C = A @ B for bf16 (`tdpbf16ps`, f32 C) or 8-bit
operands (`tdpbusd` for u8 A, `tdpbssd` for s8 A: no +128 shift, no compensation; i32 C, or
f32 through the dequantizing epilogue). C is padded to 16 rows and 32 columns so every tile
store is full. First the threads pack, each its share, A into tiles (all of it, once: never a
copy per thread) and raw B into panels (unless prepacked), then meet at a barrier. Then each
thread works through units (MC rows x one 32-column B panel) of its share of the panels,
then takes what is left of the others' (see `_each_unit`), and loops pc (KC
words: the panel's K x 32 slice that stays in L1) > ir (16 rows), keeping any partial sums
of the unit's MC x 32 column of C in a contiguous buffer between K blocks (C's own rows may
be 4 KiB apart and collide in the caches); each 16 x 32 block runs kc / 16 steps of 3 tile
loads + 2 dots and is written to C once, in the last K block, which also prefetches the
next block's C lines for writing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.gemm.abi import ParamBlock, Worker, emit_entry, emit_worker
from tilefold.codegen.lowp import amx
from tilefold.codegen.lowp.kernels import DotKernel
from tilefold.codegen.lowp.packgen import emit_pack_a, emit_pack_b
from tilefold.target import Target

ENTRY = "tf_amxgemm"
BLOCK = 32  # columns of C per B panel (two tiles); N is padded to it
ROWS = amx.TILE_ROWS  # rows of C per micro-block (one A tile); M is padded to it
KSTEP = amx.TILE_BYTES // 4  # k-group words per tile step
_P8 = u.i8.as_pointer()
_FP = u.f32.as_pointer()


class AParam(ParamBlock):
    """Slots of the int64 parameter block of `tf_amxgemm`."""

    M = 0
    K = 1  # elements
    N = 2
    MP = 3  # M padded to ROWS and N to BLOCK (C's allocated shape)
    NP = 4
    KGP = 5  # k-group words padded to KSTEP
    LDA = 6  # bytes
    LDB = 7  # bytes
    MC = 8
    KC = 9  # words, a multiple of KSTEP
    THREADS = 10
    DATA_OFFSET = 11
    PACK_B = 12  # 1: B is raw [K, N], pack it into ws first
    A_OFFSET = 13  # bytes of ws before packed A (after packed B)
    SUM_OFFSET = 14  # bytes of ws before the per-thread partial-sum buffers (MC x 32 words)
    NEXT_OFFSET = 15  # bytes of ws before the threads' next-unit counters (i64, 64 B apart)
    ROW_SCALE = 16
    COL_SCALE = 17
    BIAS = 18


def _share(b: ir.IRBuilder, extent, parts, index, unit: int):
    """Start of part `index` of `parts` over `extent`, in whole `unit`s."""
    units = b.sdiv(extent, u.const(unit))
    return b.mul(b.sdiv(b.mul(units, index), parts), u.const(unit))


def _pack_shares(b, x: Worker, k: DotKernel, pack_a, pack_b, tid, nth, apack, counter) -> None:
    """This thread's share of A's 16-row tile rows into apack and (when raw) of B's panels
    into ws, and its unit counter zeroed; then the barrier (with company) after which all of
    both are packed and every counter is zero."""
    kgp = x[AParam.KGP]
    r0, r1 = (_share(b, x[AParam.MP], nth, t, amx.TILE_ROWS) for t in (tid, b.add(tid, u.const(1))))
    dst = u.gep(b, apack, b.mul(b.mul(r0, kgp), u.const(4)))
    b.call(pack_a, [x.x, x[AParam.LDA], x[AParam.M], b.mul(x[AParam.K], u.const(4 // k.kgroup)),
                    r0, b.sub(r1, r0), u.const(0), kgp, dst])
    with b.if_then(b.icmp_signed("!=", x[AParam.PACK_B], u.const(0))):
        panels = b.sdiv(x[AParam.NP], u.const(BLOCK))
        p0, p1 = (_share(b, panels, nth, t, 1) for t in (tid, b.add(tid, u.const(1))))
        b.call(pack_b, [x.y, x[AParam.LDB], x[AParam.K], x[AParam.N], kgp, p0, p1, x.ws])
    b.store(u.const(0), _counter(b, counter, tid))
    with b.if_then(b.icmp_signed(">", nth, u.const(1))):
        barrier = u.intrinsic(b.module, "tilefold_barrier", u.void, [u.i32])
        b.call(barrier, [b.trunc(tid, u.i32)])


def _block_tiles(b, k: DotKernel, apan, kts, bpan, c_in, c_out, first, last, c_next) -> None:
    """One K block of a ROWS x 32 C block (two accumulator tiles side by side): tiles <- 0 or
    c_in = (pointer, stride); add A tiles apan[kt] times B rows bpan[16 kt ...] for kt < kts;
    store to c_out = (pointer, stride). In the last K block the next block's C lines (c_next)
    are prefetched for writing; partial sums stay in a buffer in cache.

    Each step loads one A tile and two B tiles for two products. A 2 x 2 block (four
    accumulators, one load per product) uses all eight tiles, and on this host (Emerald
    Rapids, shared cores) kernels touching more than five or six tiles lose throughput
    whenever the core is contended: measured 1x2 vs 2x2 steps on L1 data, 870 vs 510
    GFLOP/s contended and 2040 vs 1650 uncontended (A streaming from L2: 740 vs 460, 1900
    vs 1500)."""
    row_bytes = BLOCK * 4
    halves = [lambda p: p, lambda p: u.gep(b, p, amx.TILE_BYTES)]
    with b.if_else(first) as (fresh, partial):
        with fresh:
            for t in range(2):
                amx.zero(b, t)
        with partial:
            for t, at in enumerate(halves):
                amx.load(b, t, at(c_in[0]), c_in[1])
    with b.if_then(last):
        for r in range(ROWS):
            line = u.gep(b, c_next[0], b.mul(c_next[1], u.const(r)))
            for half in range(row_bytes // 64):
                u.prefetch(b, u.gep(b, line, 64 * half), write=True)
    with u.for_range(b, u.const(0), kts, 1, "kt") as kt:
        b0 = u.gep(b, bpan, b.mul(kt, u.const(KSTEP * row_bytes)))
        amx.load(b, 6, b0, row_bytes)
        amx.load(b, 7, u.gep(b, b0, amx.TILE_BYTES), row_bytes)
        amx.load(b, 4, u.gep(b, apan, b.mul(kt, u.const(amx.TILE_SIZE))), amx.TILE_BYTES)
        amx.dot(b, k.dot, 0, 4, 6)
        amx.dot(b, k.dot, 1, 4, 7)
    for t, at in enumerate(halves):
        amx.store(b, t, at(c_out[0]), c_out[1])


def _dequantize_block(b, x: Worker, cptr, row, col, ldc_bytes) -> None:
    """C[ROWS, 32] at cptr, int32 -> f32 * row_scale[row + i] * col_scale[col + j] + bias[...]
    (the scale and bias vectors are padded to MP and NP)."""
    lanes = 16
    fty, ity = u.vec(u.f32, lanes), u.vec(u.i32, lanes)
    rs, cs, bias = (b.inttoptr(x[s], _FP) for s in (
        AParam.ROW_SCALE, AParam.COL_SCALE, AParam.BIAS))
    cols = [(b.load(b.bitcast(u.gep(b, cs, b.add(col, u.const(v * lanes))), fty.as_pointer()),
                    align=4),
             b.load(b.bitcast(u.gep(b, bias, b.add(col, u.const(v * lanes))), fty.as_pointer()),
                    align=4)) for v in range(BLOCK // lanes)]
    with u.for_range(b, u.const(0), u.const(ROWS), 1, "dq") as i:
        scale = u.splat(b, b.load(u.gep(b, rs, b.add(row, i)), align=4), lanes)
        line = u.gep(b, cptr, b.mul(i, ldc_bytes))
        for v, (cv, bv) in enumerate(cols):
            ptr = u.gep(b, line, v * lanes * 4)
            acc = b.sitofp(b.load(b.bitcast(ptr, ity.as_pointer()), align=4), fty)
            b.store(u.fma(b, b.fmul(acc, scale), cv, bv), b.bitcast(ptr, fty.as_pointer()),
                    align=4)


def _counter(b: ir.IRBuilder, counters: ir.Value, thread: ir.Value) -> ir.Value:
    """Thread `thread`'s next-unit counter (each on its own cache line)."""
    return b.bitcast(u.gep(b, counters, b.mul(thread, u.const(64))), u.i64.as_pointer())


@contextmanager
def _each_unit(b: ir.IRBuilder, counters: ir.Value, tid, nth, panels,
               mblocks) -> Iterator[tuple[ir.Value, ir.Value]]:
    """Yields (row block, panel) for every unit this thread takes. Thread t owns the units
    of its share of the panels, row block by row block (its B panels then stay in its L2
    across row blocks), and takes them from its own counter; when they run out it takes the
    others' remaining units from their counters, so a thread the OS preempts (the cores here
    are shared) or one that started late does not hold everyone at the end."""
    def take(victim: ir.Value) -> ir.Value:
        return b.atomic_rmw("add", _counter(b, counters, victim), u.const(1), "monotonic")

    with u.for_range(b, u.const(0), nth, 1, "victim") as v:
        victim = b.srem(b.add(tid, v), nth)
        p0, p1 = (_share(b, panels, nth, t, 1) for t in (victim, b.add(victim, u.const(1))))
        owned = b.sub(p1, p0)
        units = b.mul(owned, mblocks)
        entry = b.block
        first = take(victim)
        head = b.append_basic_block("unit.head")
        body = b.append_basic_block("unit.body")
        done = b.append_basic_block("unit.done")
        b.branch(head)
        b.position_at_end(head)
        unit = b.phi(u.i64, "unit")
        unit.add_incoming(first, entry)
        b.cbranch(b.icmp_signed("<", unit, units), body, done)
        b.position_at_end(body)
        yield b.sdiv(unit, owned), b.add(p0, b.srem(unit, owned))
        unit.add_incoming(take(victim), b.block)
        b.branch(head)
        b.position_at_end(done)


def _emit_worker(module: ir.Module, k: DotKernel, dequant: bool, pack_a, pack_b):
    x = emit_worker(module, "tf_amxgemm_worker", _P8, _P8, _P8, _P8)
    b, tid, nth = x.b, x.tid, x.nth
    kgp = x[AParam.KGP]
    apack = u.gep(b, x.ws, x[AParam.A_OFFSET])
    counters = u.gep(b, x.ws, x[AParam.NEXT_OFFSET])
    _pack_shares(b, x, k, pack_a, pack_b, tid, nth, apack, counters)
    bm = b.select(b.icmp_signed("!=", x[AParam.PACK_B], u.const(0)), x.ws, x.y)
    mcb, kcb = x[AParam.MC], x[AParam.KC]
    cbuf = u.gep(b, x.ws, b.add(x[AParam.SUM_OFFSET], b.mul(b.mul(tid, mcb), u.const(BLOCK * 4))))
    ldc_bytes = b.mul(x[AParam.NP], u.const(4))
    a_tiles = b.mul(b.sdiv(kgp, u.const(KSTEP)), u.const(amx.TILE_SIZE))  # bytes a tile row
    panels = b.sdiv(x[AParam.NP], u.const(BLOCK))
    mblocks = b.sdiv(b.add(x[AParam.MP], b.sub(mcb, u.const(1))), mcb)
    amx.load_config(b)
    with _each_unit(b, counters, tid, nth, panels, mblocks) as (mblock, p):
        ic = b.mul(mblock, mcb)
        jr = b.mul(p, u.const(BLOCK))
        mc = u.smin(b, mcb, b.sub(x[AParam.MP], ic))
        abuf = u.gep(b, apack, b.mul(b.mul(ic, kgp), u.const(4)))
        panel = u.gep(b, bm, b.mul(b.mul(b.sdiv(jr, u.const(BLOCK)), kgp), u.const(BLOCK * 4)))
        with u.for_range(b, u.const(0), kgp, kcb, "pc") as pc:
            kc = u.smin(b, kcb, b.sub(kgp, pc))
            first = b.icmp_signed("==", pc, u.const(0))
            last = b.icmp_signed(">=", b.add(pc, kc), kgp)
            bpan = u.gep(b, panel, b.mul(pc, u.const(BLOCK * 4)))
            with u.for_range(b, u.const(0), mc, ROWS, "ir") as ir_:
                row = b.add(ic, ir_)
                cptr = u.gep(b, x.z, b.mul(b.add(b.mul(row, x[AParam.NP]), jr), u.const(4)))
                apan = u.gep(b, abuf, b.add(b.mul(b.sdiv(ir_, u.const(ROWS)), a_tiles),
                                            b.mul(b.sdiv(pc, u.const(KSTEP)),
                                                  u.const(amx.TILE_SIZE))))
                part = (u.gep(b, cbuf, b.mul(ir_, u.const(BLOCK * 4))), u.const(BLOCK * 4))
                out = tuple(b.select(last, x, y) for x, y in zip((cptr, ldc_bytes), part,
                                                                  strict=True))
                nxt = (u.gep(b, cptr, b.mul(ldc_bytes, u.const(ROWS))), ldc_bytes)
                _block_tiles(b, k, apan, b.sdiv(kc, u.const(KSTEP)), bpan, part, out,
                             first, last, nxt)
                if dequant:
                    with b.if_then(last):
                        _dequantize_block(b, x, cptr, row, jr, ldc_bytes)
    amx.release(b)
    b.ret_void()
    return x.fn


def amxgemm_ir(k: DotKernel, target: Target, dequant: bool = False) -> str:
    """LLVM IR of the AMX GEMM module for `k` (with the dequantizing epilogue)."""
    module = ir.Module(name=f"tf_amxgemm_{k.name}{'_dq' if dequant else ''}")
    module.triple = target.triple
    pack_a = emit_pack_a(module)
    pack_b = emit_pack_b(module, BLOCK, k.kgroup)
    worker = _emit_worker(module, k, dequant, pack_a, pack_b)
    emit_entry(module, worker, ENTRY, AParam)
    return str(module)
