"""The low-precision GEMM module in LLVM IR: one driver for every native registry row (AMX tiles
and register tiles of dot steps alike), parametric in the micro-kernel and the A codes.

`tf_lowp_gemm(params, A, B, C, ws)` computes C = A @ B for bf16/f16 (f32 C) or 8-bit operands
(i32 C, or f32 through the dequantizing epilogue). C is padded to whole MR x NR blocks so every
block store is full. First the threads pack, each its share, A into MR-row panels (all of it,
once: never a copy per thread) and raw B into NR-column panels (unless prepacked), then meet at
a barrier. Then each thread works through units (MC rows x one B panel) of its share of the
panels, then takes what is left of the others' (see `_each_unit`), and loops pc (KC words: the
panel's K x NR slice that stays in L1) > ir (MR rows), keeping any partial sums of the unit's
MC x NR column of C in a contiguous buffer between K blocks (C's own rows may be 4 KiB apart
and collide in the caches). Each block is written to C once, in the last K block, which also
prefetches the next block's C lines for writing and finishes the block in L1: subtracts the
signed-A compensation (A flipped to u8) and dequantizes (row scale * column scale + bias).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.gemm.abi import ParamBlock, Worker, emit_entry, emit_worker
from tilefold.codegen.llvm.lowp.kernels import DotKernel
from tilefold.codegen.llvm.lowp.microkernel import CHUNK_WORDS, micro_kernel
from tilefold.codegen.llvm.lowp.packgen import emit_pack_a, emit_pack_b
from tilefold.target import Target

ENTRY = "tf_lowp_gemm"
_P8 = u.i8.as_pointer()
_FP = u.f32.as_pointer()


class LParam(ParamBlock):
    """Slots of the int64 parameter block of `tf_lowp_gemm`."""

    M = 0
    K = 1  # elements
    N = 2
    MP = 3  # M padded to MR and N to NR (C's allocated shape)
    NP = 4
    KGP = 5  # k-group words padded to CHUNK_WORDS
    LDA = 6  # bytes
    A_BYTES = 7  # bytes of A's codes a row
    LDB = 8  # bytes
    MC = 9
    KC = 10  # words, a multiple of CHUNK_WORDS
    THREADS = 11
    DATA_OFFSET = 12
    PACK_B = 13  # 1: B is raw [K, N], pack it into ws first
    A_OFFSET = 14  # bytes of ws before packed A (after packed B)
    SUM_OFFSET = 15  # bytes of ws before the per-thread partial-sum buffers (MC x NR words)
    NEXT_OFFSET = 16  # bytes of ws before the threads' next-unit counters (i64, 64 B apart)
    COMP = 17  # i32[NP]: 128 * colsum(B), subtracted when A was flipped to u8
    ROW_SCALE = 18  # f32[MP], f32[NP], f32[NP]: the dequantizing epilogue's vectors
    COL_SCALE = 19
    BIAS = 20


def _share(b: ir.IRBuilder, extent, parts, index, unit: int):
    """Start of part `index` of `parts` over `extent`, in whole `unit`s."""
    units = b.sdiv(extent, u.const(unit))
    return b.mul(b.sdiv(b.mul(units, index), parts), u.const(unit))


def _pack_shares(b, x: Worker, k: DotKernel, pack_a, pack_b, apack, counters) -> None:
    """This thread's share of A's MR-row panels into apack and (when raw) of B's panels into
    ws, and its unit counter zeroed; then the barrier (with company) after which all of both
    are packed and every counter is zero."""
    tid, nth = x.tid, x.nth
    r0, r1 = (_share(b, x[LParam.MP], nth, t, k.mr) for t in (tid, b.add(tid, u.const(1))))
    dst = u.gep(b, apack, b.mul(b.mul(r0, x[LParam.KGP]), u.const(4)))
    b.call(pack_a, [x.x, x[LParam.LDA], x[LParam.M], x[LParam.A_BYTES], r0, b.sub(r1, r0),
                    x[LParam.KGP], dst])
    with b.if_then(b.icmp_signed("!=", x[LParam.PACK_B], u.const(0))):
        panels = b.sdiv(x[LParam.NP], u.const(k.nr))
        p0, p1 = (_share(b, panels, nth, t, 1) for t in (tid, b.add(tid, u.const(1))))
        b.call(pack_b, [x.y, x[LParam.LDB], x[LParam.K], x[LParam.N], x[LParam.KGP], p0, p1,
                        x.ws])
    b.store(u.const(0), _counter(b, counters, tid))
    with b.if_then(b.icmp_signed(">", nth, u.const(1))):
        barrier = u.intrinsic(b.module, "tilefold_barrier", u.void, [u.i32])
        b.call(barrier, [b.trunc(tid, u.i32)])


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


def _prefetch_block(b: ir.IRBuilder, k: DotKernel, ptr: ir.Value, ldc_bytes: ir.Value) -> None:
    """Prefetch for writing the MR x NR block of C at `ptr`."""
    for r in range(k.mr):
        line = u.gep(b, ptr, b.mul(ldc_bytes, u.const(r)))
        for half in range(-(-k.nr * 4 // 64)):
            u.prefetch(b, u.gep(b, line, 64 * half), write=True)


def _finish_block(b, x: Worker, k: DotKernel, cptr, row, col, ldc_bytes, compensate: bool,
                  dequant: bool) -> None:
    """The block's i32 sums at cptr less comp[col + j] (`compensate`), then (`dequant`) as f32
    * row_scale[row + i] * col_scale[col + j] + bias[col + j] (vectors padded to MP and NP)."""
    lanes = k.lanes
    fty, ity = u.vec(u.f32, lanes), u.vec(u.i32, lanes)

    def vector(slot: LParam, ty, ptr_ty, v: int):
        base = b.inttoptr(x[slot], ptr_ty)
        return b.load(b.bitcast(u.gep(b, base, b.add(col, u.const(v * lanes))), ty.as_pointer()),
                      align=4)

    nv = k.nr // lanes
    comp = [vector(LParam.COMP, ity, u.i32.as_pointer(), v) for v in range(nv)] \
        if compensate else []
    scale = [(vector(LParam.COL_SCALE, fty, _FP, v), vector(LParam.BIAS, fty, _FP, v))
             for v in range(nv)] if dequant else []
    rs = b.inttoptr(x[LParam.ROW_SCALE], _FP) if dequant else None
    with u.for_range(b, u.const(0), u.const(k.mr), 1, "fin") as i:
        line = u.gep(b, cptr, b.mul(i, ldc_bytes))
        row_scale = u.splat(b, b.load(u.gep(b, rs, b.add(row, i)), align=4), lanes) \
            if dequant else None
        for v in range(nv):
            ptr = u.gep(b, line, v * lanes * 4)
            acc = b.load(b.bitcast(ptr, ity.as_pointer()), align=4)
            if compensate:
                acc = b.sub(acc, comp[v])
            if dequant:
                col_scale, bias = scale[v]
                out = u.fma(b, b.fmul(b.sitofp(acc, fty), row_scale), col_scale, bias)
                b.store(out, b.bitcast(ptr, fty.as_pointer()), align=4)
            else:
                b.store(acc, b.bitcast(ptr, ity.as_pointer()), align=4)


def _emit_worker(module: ir.Module, k: DotKernel, a_code: str, dequant: bool, emulate: bool):
    x = emit_worker(module, "tf_lowp_gemm_worker", _P8, _P8, _P8, _P8)
    b = x.b
    micro = micro_kernel(b, k, emulate)  # in the entry block: emulated tiles live on its stack
    pack_a = emit_pack_a(module, k.mr, a_code)
    pack_b = emit_pack_b(module, k.nr, k.kgroup, k.s16_codes)
    kgp = x[LParam.KGP]
    apack = u.gep(b, x.ws, x[LParam.A_OFFSET])
    counters = u.gep(b, x.ws, x[LParam.NEXT_OFFSET])
    _pack_shares(b, x, k, pack_a, pack_b, apack, counters)
    bm = b.select(b.icmp_signed("!=", x[LParam.PACK_B], u.const(0)), x.ws, x.y)
    mcb, kcb = x[LParam.MC], x[LParam.KC]
    row_bytes = k.nr * 4
    cbuf = u.gep(b, x.ws, b.add(x[LParam.SUM_OFFSET], b.mul(b.mul(x.tid, mcb),
                                                            u.const(row_bytes))))
    ldc_bytes = b.mul(x[LParam.NP], u.const(4))
    panel_bytes = b.mul(kgp, u.const(k.mr * 4))  # one MR-row panel of A over all of K
    panels = b.sdiv(x[LParam.NP], u.const(k.nr))
    mblocks = b.sdiv(b.add(x[LParam.MP], b.sub(mcb, u.const(1))), mcb)
    compensate = a_code == "flip"
    micro.begin()
    with _each_unit(b, counters, x.tid, x.nth, panels, mblocks) as (mblock, p):
        ic = b.mul(mblock, mcb)
        jr = b.mul(p, u.const(k.nr))
        mc = u.smin(b, mcb, b.sub(x[LParam.MP], ic))
        abuf = u.gep(b, apack, b.mul(b.mul(ic, kgp), u.const(4)))
        panel = u.gep(b, bm, b.mul(b.mul(p, kgp), u.const(row_bytes)))
        with u.for_range(b, u.const(0), kgp, kcb, "pc") as pc:
            kc = u.smin(b, kcb, b.sub(kgp, pc))
            first = b.icmp_signed("==", pc, u.const(0))
            last = b.icmp_signed(">=", b.add(pc, kc), kgp)
            bpan = u.gep(b, panel, b.mul(pc, u.const(row_bytes)))
            with u.for_range(b, u.const(0), mc, k.mr, "ir") as ir_:
                row = b.add(ic, ir_)
                cptr = u.gep(b, x.z, b.mul(b.add(b.mul(row, x[LParam.NP]), jr), u.const(4)))
                apan = u.gep(b, abuf, b.add(b.mul(b.sdiv(ir_, u.const(k.mr)), panel_bytes),
                                            b.mul(pc, u.const(k.mr * 4))))
                part = (u.gep(b, cbuf, b.mul(ir_, u.const(row_bytes))), u.const(row_bytes))
                out = tuple(b.select(last, c, s) for c, s in zip((cptr, ldc_bytes), part,
                                                                  strict=True))
                with b.if_then(last):
                    _prefetch_block(b, k, u.gep(b, cptr, b.mul(ldc_bytes, u.const(k.mr))),
                                    ldc_bytes)
                micro.block(apan, b.sdiv(kc, u.const(CHUNK_WORDS)), bpan, part, out, first)
                if compensate or dequant:
                    with b.if_then(last):
                        _finish_block(b, x, k, cptr, row, jr, ldc_bytes, compensate, dequant)
    micro.end()
    b.ret_void()
    return x.fn


def lowp_gemm_ir(k: DotKernel, target: Target, a_code: str = "copy", dequant: bool = False,
                 emulate: bool = False) -> str:
    """LLVM IR of the GEMM module for micro-kernel `k`, A codes packed as `a_code`
    (`packgen.A_CODES`), with the dequantizing epilogue; `emulate`: AMX tiles as vector code
    (for testing the driver on hosts without AMX; slow)."""
    variant = f"{a_code}{'_dq' if dequant else ''}{'_emulated' if emulate else ''}"
    module = ir.Module(name=f"tf_lowp_gemm_{k.name}_{variant}")
    module.triple = target.triple
    worker = _emit_worker(module, k, a_code, dequant, emulate)
    emit_entry(module, worker, ENTRY, LParam)
    return str(module)
