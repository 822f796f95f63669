"""The ISA-blind GEMM driver in LLVM IR: thread split, the five BLIS loops, edge dispatch.

`tf_gemm(params, A, B, C, workspace)` (A, B, C: NumPy array objects, or raw data pointers when
`params[DATA_OFFSET]` is -1) computes, for every batch entry, C (+)= A @ B on the
sub-blocks that `tilefold_parallel` hands each thread. Shapes, strides, blocking and the split
are run-time values in `params` (see `Param`), so one compiled module serves every shape.
"""

from __future__ import annotations

import enum

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.gemm.abi import ParamBlock, emit_entry, emit_worker, unoptimized
from tilefold.codegen.llvm.gemm.microkernel import UKERNEL_TYPE
from tilefold.codegen.llvm.gemm.packing import F32, Source, emit_pack_a, emit_pack_b
from tilefold.codegen.llvm.gemm.registry import MicroKernel

_FP = u.f32.as_pointer()
_I64P = u.i64.as_pointer()
ENTRY = "tf_gemm"
PACK_B = "tf_pack_b"


class Param(ParamBlock):
    """Slots of the int64 parameter block that a plan fills once per (shape, strides)."""

    M = 0
    N = 1
    K = 2
    RSA = 3
    CSA = 4
    RSB = 5
    CSB = 6
    RSC = 7
    BETA = 8
    BATCH = 9
    TM = 10
    TN = 11
    THREADS = 12
    BMODE = 13
    OFFSETS = 14
    WS_PER_THREAD = 15
    MC = 16
    KC = 17
    NC = 18
    DATA_OFFSET = 19  # byte offset of the data pointer in a NumPy array object; -1: raw pointers
    N_UNIT = 20  # columns the N split is rounded to: NR for pre-packed B, else the vector width
    STREAM = 21  # 1: tiles prefetch what the next tiles read of B (B larger than L2 holds)


class BMode(enum.IntEnum):
    """Where B micro-panels come from."""

    PACK = 0  # packed per (KC, NC) block into the workspace
    PREPACKED = 1  # packed once by `prepack`, the full-K panel layout
    DIRECT = 2  # read in place (unit column stride); a panel ending inside a vector is packed
    # (f32 sources only: A and B of another element type are always packed, i.e. widened)


def emit_gemm(module: ir.Module, kernel: MicroKernel, row_major_a: bool = True,
              src: Source = F32) -> ir.Function:
    """Add `tf_gemm` and everything it calls for `kernel` to `module`; `row_major_a=False`
    when plans never give the kernel A with contiguous rows to pack (see `emit_pack_a`).
    A and B hold `src` elements (C is f32); other than f32 they are widened while packed."""
    table = _kernel_table(module, kernel)
    pack_a = (None if kernel.a_direct
              else emit_pack_a(module, kernel.m_sizes, row_major=row_major_a, src=src))
    pack_b = emit_pack_b(module, kernel.nr, kernel.lanes, PACK_B, src)
    block = _emit_block(module, kernel, table, pack_a, pack_b, src)
    worker = _emit_worker(module, kernel, block, src)
    return emit_entry(module, worker, ENTRY, Param)


def _kernel_table(module: ir.Module, kernel: MicroKernel) -> ir.GlobalVariable:
    """[row-size index][nv-1] -> micro-kernel variant, so edges cost one indirect call."""
    emitted: dict = {}
    fns = []
    for mr in kernel.m_sizes:
        for nv in range(1, kernel.nv + 1):
            spec = kernel.spec(mr, nv)
            if spec not in emitted:
                emitted[spec] = kernel.generator(module, spec)
            fns.append(emitted[spec])
    ptr = UKERNEL_TYPE.as_pointer()
    arr = ir.ArrayType(ptr, len(fns))
    table = ir.GlobalVariable(module, arr, "tf_uk_table")
    table.global_constant = True
    table.linkage = "internal"
    table.initializer = ir.Constant(arr, fns)
    return table


# B micro-panels packed at a time, just before the first tiles that read them.
PACK_PANELS = 8
_BLOCK_ARGS = ("m0", "m1", "n0", "n1", "k", "a", "rsa", "csa", "b", "rsb", "csb", "c", "rsc",
               "beta", "bmode", "mc_blk", "kc_blk", "nc_blk", "ws", "stream")


def _emit_block(module, kernel, table, pack_a, pack_b, src: Source) -> ir.Function:
    """The five loops over C[m0:m1, n0:n1] for one thread (its own packing buffers in `ws`).

    `a_direct` kernels get A in place (row stride `rsa`, needs `csa` = 1), so no A buffer.
    A and B point to `src` elements; pre-packed B (BMode.PREPACKED) is f32 panels."""
    i64, sp = u.i64, src.ptr
    types = [i64] * 5 + [sp, i64, i64, sp, i64, i64, _FP, i64, u.i32, i64, i64, i64, i64, _FP,
                         i64]
    fn = ir.Function(module, ir.FunctionType(u.void, types), name="tf_gemm_block")
    fn.linkage = "internal"
    for arg, name in zip(fn.args, _BLOCK_ARGS, strict=True):
        arg.name = name
    (m0, m1, n0, n1, k, a, rsa, csa, bm, rsb, csb, c, rsc, beta, bmode, mcb, kcb, ncb,
     ws, streaming) = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, nr_max = kernel.lanes, kernel.nr
    ap = ws
    bp = ws if kernel.a_direct else u.gep(b, ws, b.mul(mcb, kcb))
    is_pack = b.icmp_signed("==", bmode, u.const(BMode.PACK))
    is_pre = b.icmp_signed("==", bmode, u.const(BMode.PREPACKED))
    is_direct = b.icmp_signed("==", bmode, u.const(BMode.DIRECT))
    b_pre = bm if src == F32 else b.bitcast(bm, _FP)
    chunk = u.const(nr_max * PACK_PANELS)
    # One MC block of rows uses each packed panel right after packing it, never again: the
    # chunks then take turns in one chunk's buffer (in L2), not a whole block's (in L3).
    ring = (u.const(0, u.i1) if kernel.a_in_l1
            else b.and_(is_pack, b.icmp_signed("<=", b.sub(m1, m0), mcb)))

    def slot(jr):
        """Where panel `jr` (a column) sits in the packed buffer, in columns."""
        return b.select(ring, b.srem(jr, chunk), jr)
    with u.for_range(b, n0, n1, ncb, "jc") as jc:
        nc = u.smin(b, ncb, b.sub(n1, jc))
        with u.for_range(b, u.const(0), k, kcb, "pc") as pc:
            kc = u.smin(b, kcb, b.sub(k, pc))
            beta_eff = b.select(b.icmp_signed("==", pc, u.const(0)), beta, u.const(1, u.i32))
            b_blk = u.gep(b, bm, b.add(b.mul(pc, rsb), b.mul(jc, csb)))
            with u.for_range(b, m0, m1, mcb, "ic") as ic:
                mc = u.smin(b, mcb, b.sub(m1, ic))
                a_blk = u.gep(b, a, b.add(b.mul(ic, rsa), b.mul(pc, csa)))
                if pack_a is not None:
                    b.call(pack_a, [mc, kc, a_blk, rsa, csa, ap])
                c_blk = u.gep(b, c, b.add(b.mul(ic, rsc), jc))
                first_ic = b.icmp_signed("==", ic, m0)

                def panel_of(jr):
                    """B micro-panel `jr` of this block: (pointer, floats per k, nv, width)."""
                    nr = u.smin(b, u.const(nr_max), b.sub(nc, jr))
                    nv = b.sdiv(b.add(nr, u.const(vl - 1)), u.const(vl))
                    nlast = b.sub(nr, b.mul(b.sub(nv, u.const(1)), u.const(vl)))
                    w = b.mul(nv, u.const(vl))
                    panel_packed = u.gep(b, bp, b.mul(slot(jr), kc))
                    panel_pre = u.gep(b, b_pre, b.add(b.mul(b.add(jc, jr), k), b.mul(pc, w)))
                    if src != F32:  # plans never read such B in place
                        return b.select(is_pre, panel_pre, panel_packed), w, nv, nr
                    panel_direct = u.gep(b, b_blk, jr)
                    in_place = b.and_(is_direct, b.icmp_signed("==", nlast, u.const(vl)))
                    with b.if_then(b.and_(is_direct, b.not_(in_place))):
                        b.call(pack_b, [kc, nr, panel_direct, rsb, csb, bp])
                    panel = b.select(is_pre, panel_pre,
                                     b.select(in_place, panel_direct,
                                              b.select(is_direct, bp, panel_packed)))
                    return panel, b.select(in_place, rsb, w), nv, nr

                def stream(jr, ir_, here):
                    """The prefetch stream (pointer, step, lines) of tile `ir_` of panel `jr`:
                    its `share`, worked out only where the plan streams. A stream with no
                    lines stays on `here`, the tile's own panel (a prefetch of an unmapped
                    address would walk the page tables every iteration)."""
                    i8p = u.i8.as_pointer()
                    if not kernel.streams:
                        return ir.Constant(i8p, None), u.const(0), u.const(0)
                    here = b.bitcast(here, i8p)
                    before = b.block
                    with b.if_then(b.icmp_signed("!=", streaming, u.const(0))):
                        at, step, count = share(jr, ir_)
                        at = b.select(b.icmp_signed(">", count, u.const(0)),
                                      b.bitcast(at, i8p), here)
                        computed = b.block
                    out = []
                    for value, off in ((at, here), (step, u.const(0)), (count, u.const(0))):
                        phi = b.phi(value.type)
                        phi.add_incoming(off, before)
                        phi.add_incoming(value, computed)
                        out.append(phi)
                    return out

                def share(jr, ir_):
                    """Tile `ir_`'s share of what the next tiles read from beyond L2, for its
                    prefetch stream (one line per main-loop iteration, `lines` in all): the
                    next pre-packed panel (contiguous) or the next panel read in place (a line
                    per k, B's row stride apart), taken in turn by the panel's tiles; with
                    BMode.PACK, the source of the next chunk of panels, taken by the chunk's
                    tiles a line-wide column of B rows each, down from `pc` (B widened while
                    packed: pre-packed panels only). Count 0 past the last panels."""
                    lines = b.sdiv(kc, u.const(kernel.unroll))
                    t = b.sdiv(ir_, u.const(kernel.mr))
                    nxt = b.add(jr, u.const(nr_max))
                    first = b.mul(t, lines)
                    pre = u.gep(b, b_pre, b.add(b.mul(b.add(jc, nxt), k),
                                                b.mul(pc, u.const(nr_max))))
                    at = u.gep(b, pre, b.mul(first, u.const(16)))
                    total = b.sdiv(b.mul(kc, u.const(nr_max)), u.const(16))
                    done, step = first, u.const(64)
                    on = b.and_(is_pre, b.icmp_signed("<", nxt, nc))
                    if src == F32:
                        direct_at = u.gep(b, b_blk, b.add(nxt, b.mul(first, rsb)))
                        # PACK: tile q of the chunk takes column q % W (W lines per row, one
                        # more than the chunk's width for a source not aligned to lines),
                        # rows from (q / W) * lines.
                        width = nr_max * PACK_PANELS * 4 // 64 + 1
                        tiles = b.sdiv(b.add(mc, u.const(kernel.mr - 1)), u.const(kernel.mr))
                        q = b.add(b.mul(b.sdiv(b.srem(jr, chunk), u.const(nr_max)), tiles), t)
                        rows_from = b.mul(b.sdiv(q, u.const(width)), lines)
                        nxt_chunk = b.add(b.sub(jr, b.srem(jr, chunk)), chunk)
                        pack_at = u.gep(b, b_blk, b.add(
                            b.add(nxt_chunk, b.mul(b.srem(q, u.const(width)), u.const(16))),
                            b.mul(rows_from, rsb)))
                        at = b.select(is_pre, at, b.select(is_pack, pack_at, direct_at))
                        total = b.select(is_pre, total, kc)
                        done = b.select(is_pack, rows_from, first)
                        step = b.select(is_pre, step, b.mul(rsb, u.const(4)))
                        on = b.select(is_pack,
                                      b.and_(first_ic, b.icmp_signed("<", nxt_chunk, nc)),
                                      b.icmp_signed("<", nxt, nc))
                    left = u.smax(b, u.const(0), u.smin(b, lines, b.sub(total, done)))
                    return at, step, b.select(on, left, u.const(0))

                def tile(jr, ir_, mr, panel):
                    ptr, ldb, nv, ncols = panel
                    row = u.const(len(kernel.m_sizes) - 1)
                    for pos, size in reversed(list(enumerate(kernel.m_sizes[:-1]))):
                        row = b.select(b.icmp_signed("==", mr, u.const(size)), u.const(pos), row)
                    idx = b.add(b.mul(row, u.const(kernel.nv)), b.sub(nv, u.const(1)))
                    uk = b.load(b.gep(table, [u.const(0, u.i32), b.trunc(idx, u.i32)]))
                    a_tile = (u.gep(b, a_blk, b.mul(ir_, rsa)) if kernel.a_direct
                              else u.gep(b, ap, b.mul(ir_, kc)))
                    b.call(uk, [kc, a_tile, rsa, ptr, ldb,
                                u.gep(b, c_blk, b.add(b.mul(ir_, rsc), jr)), rsc, beta_eff,
                                ncols, *stream(jr, ir_, ptr)])

                def pack_on_the_way(jr, first):
                    """BMode.PACK: the first tiles of the block to use a chunk of panels pack
                    it just before (OpenBLAS's order), so they find it in L1 and L2, and
                    the packing overlaps their work, instead of packing the whole block
                    ahead (it leaves L2 for L3 before any tile reads it)."""
                    start = b.icmp_signed("==", b.srem(jr, chunk), u.const(0))
                    with b.if_then(b.and_(b.and_(is_pack, first), start)):
                        b.call(pack_b, [kc, u.smin(b, chunk, b.sub(nc, jr)),
                                        u.gep(b, b_blk, b.mul(jr, csb)), rsb, csb,
                                        u.gep(b, bp, b.mul(slot(jr), kc))])

                if kernel.a_in_l1:
                    with u.for_chunks(b, u.const(0), mc, kernel.m_sizes, "ir") as (ir_, mr), \
                            u.for_range(b, u.const(0), nc, nr_max, "jr") as jr:
                        pack_on_the_way(jr, b.and_(first_ic, b.icmp_signed("==", ir_,
                                                                          u.const(0))))
                        tile(jr, ir_, mr, panel_of(jr))
                else:
                    with u.for_range(b, u.const(0), nc, nr_max, "jr") as jr:
                        pack_on_the_way(jr, first_ic)
                        panel = panel_of(jr)
                        with u.for_chunks(b, u.const(0), mc, kernel.m_sizes, "ir") as (ir_, mr):
                            tile(jr, ir_, mr, panel)
    b.ret_void()
    return fn


def _split(b: ir.IRBuilder, extent, parts, index, unit):
    """Start of part `index` of `parts` over `extent`, in whole units of `unit` elements (an int
    or a run-time i64)."""
    unit = u.const(unit) if isinstance(unit, int) else unit
    units = b.sdiv(b.add(extent, b.sub(unit, u.const(1))), unit)
    start = b.mul(b.sdiv(b.mul(units, index), parts), unit)
    return u.smin(b, start, extent)


def _emit_worker(module, kernel, block, src: Source) -> ir.Function:
    """Thread body: its share of the (batch x TM x TN) grid of sub-blocks."""
    w = emit_worker(module, "tf_gemm_worker", src.ptr, src.ptr, _FP, _FP)
    unoptimized(w.fn)
    b, a, bm, c, ws, tid64, nth64 = w.b, w.x, w.y, w.z, w.ws, w.tid, w.nth
    m, n, k = w[Param.M], w[Param.N], w[Param.K]
    tm, tn = w[Param.TM], w[Param.TN]
    units = b.mul(w[Param.BATCH], b.mul(tm, tn))
    u0 = b.sdiv(b.mul(units, tid64), nth64)
    u1 = b.sdiv(b.mul(units, b.add(tid64, u.const(1))), nth64)
    offsets = b.inttoptr(w[Param.OFFSETS], _I64P)
    my_ws = u.gep(b, ws, b.mul(tid64, w[Param.WS_PER_THREAD]))
    beta = b.trunc(w[Param.BETA], u.i32)
    with u.for_range(b, u0, u1, 1, "unit") as unit:
        grid = b.mul(tm, tn)
        bi = b.sdiv(unit, grid)
        r = b.srem(unit, grid)
        ti, tj = b.sdiv(r, tn), b.srem(r, tn)
        m0 = _split(b, m, tm, ti, kernel.mr)
        m1 = _split(b, m, tm, b.add(ti, u.const(1)), kernel.mr)
        n_unit = w[Param.N_UNIT]
        n0 = _split(b, n, tn, tj, n_unit)
        n1 = _split(b, n, tn, b.add(tj, u.const(1)), n_unit)
        off = u.gep(b, offsets, b.mul(bi, u.const(3)))
        a_i, b_i, c_i = (u.gep(b, base, b.load(u.gep(b, off, j)))
                         for j, base in enumerate((a, bm, c)))
        b.call(block, [m0, m1, n0, n1, k, a_i, w[Param.RSA], w[Param.CSA], b_i, w[Param.RSB],
                       w[Param.CSB], c_i, w[Param.RSC], beta, w[Param.BMODE], w[Param.MC],
                       w[Param.KC], w[Param.NC], my_ws, w[Param.STREAM]])
    b.ret_void()
    return w.fn
