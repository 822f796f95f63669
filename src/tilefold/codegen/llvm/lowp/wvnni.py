"""Weight-only GEMV with int8 activations and an integer dot product.

The same stream layout and worker as `wgemv.py` (integer codes only: 4-bit stored as code + 8,
or int8/uint8 bytes), another prologue and tile. The prologue quantizes each row of x per block
of 32 k as llama.cpp's Q8_0 activations do: dx = max|x| / 127 (f32), q = rint(x / dx) (0 where
dx is 0), and keeps dx, sum(q) per block and sum(dx * sum(q)) per group. A tile multiplies the
codes by the s8 q in i32 (exact), per block, then in f32: acc += scale * sum_blocks dx * dot
(+ correction * group sum). 4-bit words give their low and high nibbles by a mask; 8-bit words
are the quads themselves.

Two dot instructions (`WgemvSpec.dot`): "vnni" (`vpdpbusd`, u8 x s8: int8 codes get their sign
bit flipped, u8 = c + 128, so a block's dot starts from -128 * sum(q)), and "maddubs" for CPUs
without VNNI (`pmaddubsw` + `pmaddwd`, AVX2 or AVX512BW: 4-bit codes as u8, 8-bit codes as s8
by the sign trick, uint8 ones flipped to s8 and the dot started from +128 * sum(q)); both are
exact, so both give the same result.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.lowp.dot import dpbssd_maddubs, dpbusd, dpbusd_maddubs
from tilefold.codegen.llvm.lowp.wgemv import (
    PROLOGUE_TYPE,
    TILE_TYPE,
    WgemvSpec,
    final_accumulators,
    keep_accumulators,
    load_corrections,
    load_scales,
    module_ir,
    prefetch_step,
    registers,
    store_tile,
    x_row,
)
from tilefold.target import Target

BLOCK = 32  # k per activation scale


def dot_bias(spec: WgemvSpec) -> int:
    """What each block's dot subtracts per unit of sum(q): the + 8 of stored symmetric 4-bit
    codes, the + 128 of flipped int8 codes, 0 where the layout's corrections hold it."""
    code = spec.decoder.code
    if code == "i4":
        return 0 if spec.corrected else 8
    if spec.dot == "vnni":
        return 128 if code == "i8" else 0
    return -128 if code == "u8" else 0  # maddubs: u8 codes flipped to s8 (c - 128)


def dot_step(spec: WgemvSpec):
    """The quad dot step of `spec`'s codes as the tile hands them over (u8 for vpdpbusd and
    4-bit codes, s8 for 8-bit codes under maddubs)."""
    if spec.dot == "vnni":
        return dpbusd
    return dpbusd_maddubs if spec.decoder.nibbles else dpbssd_maddubs


def rows_per_pass(lanes: int, panels: int) -> int:
    """Rows whose dot and block accumulators (one chain each) stay in registers."""
    return max(1, (registers(lanes) - 4) // (2 * panels))


def _i32v(value: int, lanes: int) -> ir.Constant:
    return ir.Constant(u.vec(u.i32, lanes), [value] * lanes)


def emit_dot_tile(module: ir.Module, spec: WgemvSpec, mt: int) -> ir.Function:
    """tile(...): y[mt, P*L] (first ncols columns) = the dequantized int8 rows of xs @ the
    tile's chunks at w; aux holds each row's block scales, block sums of q and group sums."""
    fn = ir.Function(module, TILE_TYPE, name=f"tf_wtile_{mt}")
    fn.linkage = "internal"
    xs, xrow, aux, auxrow, ng, w, chunk, y, ldy, ncols, scratch = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lanes, panels, dec = spec.lanes, spec.panels, spec.decoder
    fty, ity = u.vec(u.f32, lanes), u.vec(u.i32, lanes)
    fzero, izero = u.zeros(fty), u.zeros(ity)
    per_group = spec.group // BLOCK
    blocks = b.mul(ng, u.const(per_group))
    step_bytes = panels * lanes * 4
    steps = BLOCK // dec.per_step  # steps per block
    # vpdpbusd's accumulator is a 5-cycle chain; maddubs' is a 1-cycle vpaddd, and a second
    # chain there only took registers (spilling the block sums)
    chains = 2 if mt == 1 and spec.dot == "vnni" else 1
    n_acc = mt * panels
    in_regs = n_acc * (chains + 2) + 4 <= registers(lanes)
    bias = dot_bias(spec)
    step = dot_step(spec)
    flipped = "i8" if spec.dot == "vnni" else "u8"
    rows = [u.gep(b, xs, b.mul(u.const(m), xrow)) for m in range(mt)]
    aux_rows = [u.gep(b, aux, b.mul(u.const(m), auxrow)) for m in range(mt)]
    dx_rows = aux_rows
    qsum_rows = [b.bitcast(u.gep(b, r, blocks), u.i32.as_pointer()) for r in aux_rows]
    gsum_rows = [u.gep(b, r, b.mul(blocks, u.const(2))) for r in aux_rows]
    if not in_regs:
        for i in range(n_acc):
            b.store(fzero, u.vptr(b, u.gep(b, scratch, i * lanes), lanes), align=4)
    nib = _i32v(0x0F0F0F0F, lanes)
    flip = _i32v(0x80808080 - (1 << 32), lanes)  # the sign bit of each byte
    with u.for_range_carry(b, u.const(0), ng, 1, [fzero] * n_acc if in_regs else [], "g") as gl:
        g = gl.index
        cptr = u.gep(b, w, b.mul(g, chunk))
        with u.for_range_carry(b, u.const(0), u.const(per_group), 1, [fzero] * n_acc,
                               "blk") as bl:
            blk = b.add(b.mul(g, u.const(per_group)), bl.index)
            start = [izero] * (n_acc * chains)
            if bias:
                for m in range(mt):
                    qs = b.load(u.gep(b, qsum_rows[m], blk), align=4)
                    neg = u.splat(b, b.mul(qs, u.const(-bias, u.i32)), lanes)
                    for v in range(panels):
                        start[(m * panels + v) * chains] = neg
            dots = list(start)
            bptr = u.gep(b, cptr, b.mul(bl.index, u.const(steps * step_bytes)))
            xk0 = b.mul(blk, u.const(BLOCK))
            for s in range(steps):
                sptr = u.gep(b, bptr, s * step_bytes)
                prefetch_step(b, sptr, step_bytes)
                k0 = b.add(xk0, u.const(s * dec.per_step))
                quads = []
                for m in range(mt):
                    at = u.gep(b, rows[m], k0)
                    quads.append([u.splat(b, b.load(b.bitcast(u.gep(b, at, 4 * h),
                                                              u.i32.as_pointer()), align=1),
                                          lanes) for h in range(2 if dec.nibbles else 1)])
                for v in range(panels):
                    word = b.load(b.bitcast(u.gep(b, sptr, v * lanes * 4), ity.as_pointer()),
                                  align=4)
                    if dec.nibbles:
                        codes = [b.and_(word, nib), b.and_(b.lshr(word, _i32v(4, lanes)), nib)]
                    else:  # flipped: i8 to u8 for vpdpbusd, u8 to s8 for the sign trick
                        codes = [b.xor(word, flip) if dec.code == flipped else word]
                    for m in range(mt):
                        for h, c in enumerate(codes):
                            i = (m * panels + v) * chains + (h if dec.nibbles else s) % chains
                            dots[i] = step(b, dots[i], c, quads[m][h])
            fb = list(bl.values)
            for m in range(mt):
                dx = u.splat(b, b.load(u.gep(b, dx_rows[m], blk), align=4), lanes)
                for v in range(panels):
                    i = m * panels + v
                    d = dots[i * chains]
                    for c in range(1, chains):
                        d = b.add(d, dots[i * chains + c])
                    fb[i] = u.fma(b, b.sitofp(d, fty), dx, fb[i])
            bl.next = fb
        acc = list(gl.values) if in_regs else [
            b.load(u.vptr(b, u.gep(b, scratch, i * lanes), lanes), align=4) for i in range(n_acc)]
        tail = u.gep(b, cptr, spec.code_bytes)
        for v in range(panels):
            sc = load_scales(b, spec, tail, v)
            cr = load_corrections(b, spec, tail, v) if spec.corrected else None
            for m in range(mt):
                i = m * panels + v
                acc[i] = u.fma(b, bl.result[i], sc, acc[i])
                if cr is not None:
                    gs = u.splat(b, b.load(u.gep(b, gsum_rows[m], g), align=4), lanes)
                    acc[i] = u.fma(b, gs, cr, acc[i])
        keep_accumulators(b, gl, acc, in_regs, scratch, lanes)
    store_tile(b, final_accumulators(b, gl, in_regs, scratch, n_acc, lanes), y, ldy, ncols, mt,
               panels, lanes)
    b.ret_void()
    return fn


def emit_quantizing_prologue(module: ir.Module, spec: WgemvSpec) -> ir.Function:
    """prologue(...): per row and block of 32 k: dx = max|x| / 127, xs = rint(x / dx) as int8
    (0 where dx = 0); aux row = [dx per block (f32)][sum(q) per block (i32)][per group
    sum(dx * sum(q)) (f32)]."""
    fn = ir.Function(module, PROLOGUE_TYPE, name="tf_wx_prologue")
    fn.linkage = "internal"
    x, ldx, sxk, m, ng, k, xs, xrow, aux, auxrow, tmp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lanes = spec.lanes
    fty, ity = u.vec(u.f32, lanes), u.vec(u.i32, lanes)
    parts = BLOCK // lanes
    per_group = spec.group // BLOCK
    blocks = b.mul(ng, u.const(per_group))
    fmax = u.intrinsic(module, f"llvm.vector.reduce.fmax.v{lanes}f32", u.f32, [fty])
    iadd = u.intrinsic(module, f"llvm.vector.reduce.add.v{lanes}i32", u.i32, [ity])
    fabs = u.intrinsic(module, f"llvm.fabs.v{lanes}f32", fty, [fty])
    rint = u.intrinsic(module, f"llvm.rint.v{lanes}f32", fty, [fty])
    with u.for_range(b, u.const(0), m, 1, "r") as r:
        src = x_row(b, x, ldx, sxk, r, k, tmp)
        dst = u.gep(b, xs, b.mul(r, xrow))
        arow = u.gep(b, aux, b.mul(r, auxrow))
        qsums = b.bitcast(u.gep(b, arow, blocks), u.i32.as_pointer())
        gsums = u.gep(b, arow, b.mul(blocks, u.const(2)))
        with u.for_range(b, u.const(0), ng, 1, "gg") as g:
            with u.for_range_carry(b, u.const(0), u.const(per_group), 1,
                                   [ir.Constant(u.f32, 0.0)], "bb") as bl:
                blk = b.add(b.mul(g, u.const(per_group)), bl.index)
                at = b.mul(blk, u.const(BLOCK))
                vals = [b.load(u.vptr(b, u.gep(b, src, b.add(at, u.const(p * lanes))), lanes),
                               align=4) for p in range(parts)]
                amax = b.call(fabs, [vals[0]])
                for v in vals[1:]:
                    amax = b.call(u.intrinsic(module, f"llvm.maxnum.v{lanes}f32", fty,
                                              [fty, fty]), [amax, b.call(fabs, [v])])
                dx = b.fdiv(b.call(fmax, [amax]), ir.Constant(u.f32, 127.0))
                live = b.fcmp_ordered(">", dx, ir.Constant(u.f32, 0.0))
                dxv = u.splat(b, dx, lanes)
                total = u.zeros(ity)
                for p, v in enumerate(vals):
                    q = b.fptosi(b.call(rint, [b.fdiv(v, dxv)]), ity)
                    q = b.select(live, q, u.zeros(ity))
                    total = b.add(total, q)
                    out = b.bitcast(u.gep(b, dst, b.add(at, u.const(p * lanes))),
                                    u.vec(u.i8, lanes).as_pointer())
                    b.store(b.trunc(q, u.vec(u.i8, lanes)), out, align=1)
                qs = b.call(iadd, [total])
                b.store(dx, u.gep(b, arow, blk), align=4)
                b.store(qs, u.gep(b, qsums, blk), align=4)
                bl.next = [b.fadd(bl.values[0], b.fmul(dx, b.sitofp(qs, u.f32)))]
            b.store(bl.result[0], u.gep(b, gsums, g), align=4)
    b.ret_void()
    return fn


def wvnni_ir(spec: WgemvSpec, target: Target) -> str:
    """LLVM IR of the integer-dot module for `spec`."""
    return module_ir(spec, target, emit_dot_tile, emit_quantizing_prologue)
