"""Weight-only low-precision GEMV/skinny GEMM in LLVM IR: codes decoded to f32 in registers.

y[M, N] = x[M, K] @ W[K, N] with W in the stream layout (`wlayout.py`). One native call: each
thread first copies x into its workspace (rows padded per group to whole steps, scaled per k
where the decoder wants it, `x_scales`) and sums each group of each row (for zero points,
offsets and biased decoders), then walks its tiles front to back. Per tile and group:
tmp = sum_k x[m, k] * code[k, n] in register chains, then acc += tmp * scale[g, n]
(+ correction[g, n] * sum_g x[m, :]); the tile's columns are stored into y (row stride LDY)
under a lane mask, so y is the caller's array and N needs no padding.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.gemm.abi import ParamBlock, emit_entry, emit_worker
from tilefold.codegen.llvm.lowp.decode import (
    Decoder,
    bias_correction,
    decode_byte,
    decode_word,
    lut_constant,
    nibble_k,
    x_scales,
)
from tilefold.target import Target

ENTRY = "tf_wgemv"
_FP = u.f32.as_pointer()
_I8P = u.i8.as_pointer()
# tile(xs, xrow, aux, auxrow, ng, w, chunk, y, ldy, ncols, scratch)
TILE_TYPE = ir.FunctionType(u.void, [_I8P, u.i64, _FP, u.i64, u.i64, _I8P, u.i64, _FP, u.i64,
                                     u.i64, _FP])
# prologue(x, ldx, sxk, m, ng, k, xs, xrow, aux, auxrow, tmp)
PROLOGUE_TYPE = ir.FunctionType(u.void, [_FP, u.i64, u.i64, u.i64, u.i64, u.i64, _I8P, u.i64,
                                         _FP, u.i64, _FP])


class WParam(ParamBlock):
    """Slots of the int64 parameter block of `tf_wgemv` (its workspace regions per thread: x as
    the tiles read it, XROW bytes a row; per-row values, AUXROW 4-byte words a row; a tile
    pass's accumulators; one gathered row of strided x)."""

    M = 0
    K = 1
    LDX = 2  # x's row stride, elements
    SXK = 3  # x's column stride, elements
    LDY = 4
    N = 5
    TILES = 6
    GROUPS = 7
    CHUNK = 8  # bytes per group chunk
    XROW = 9
    AUXROW = 10
    AUX_OFF = 11  # byte offsets of the regions in a thread's workspace
    SCRATCH_OFF = 12
    TMP_OFF = 13
    WS_STRIDE = 14  # workspace bytes per thread
    THREADS = 15
    DATA_OFFSET = 16


class ChunkGeometry:
    """A group chunk of the stream layout as a kernel walks it (for specs with `decoder`,
    `group`, `panels`, `lanes` and `f16_scales`): steps of one 32-bit code word a lane, the
    code bytes and the scale bytes of a tile."""

    decoder: Decoder
    group: int
    panels: int
    lanes: int
    f16_scales: bool

    @property
    def steps(self) -> int:
        return -(-self.group // self.decoder.per_step)

    @property
    def code_bytes(self) -> int:
        return self.steps * self.panels * self.lanes * 4

    @property
    def scale_bytes(self) -> int:
        return self.panels * self.lanes * (2 if self.f16_scales else 4)


@dataclass(frozen=True)
class WgemvSpec(ChunkGeometry):
    """One compiled module: decoder, lanes, panels per tile, group (and padded group), steps
    unrolled, rows per pass, scale storage and corrections."""

    decoder: Decoder
    lanes: int
    panels: int
    group: int
    mt: int
    f16_scales: bool
    corrected: bool
    dot: str = ""  # int8 x (per block of 32) and an integer dot: "vnni" | "maddubs" (`wvnni.py`)

    @property
    def group_padded(self) -> int:
        return self.steps * self.decoder.per_step

    @property
    def sums(self) -> bool:
        """Whether the kernel needs each group's sum of x."""
        return self.corrected or bias_correction(self.decoder, self.corrected) != 0


    @property
    def name(self) -> str:
        flags = ("h" if self.f16_scales else "f") + ("c" if self.corrected else "")
        kind = {"": "wgemv", "vnni": "wvnni", "maddubs": "wmaddubs"}[self.dot]
        return (f"{kind}_{self.decoder.tag}_l{self.lanes}p{self.panels}_g{self.group}_"
                f"m{self.mt}{flags}")


def workspace(spec: WgemvSpec, m: int, k: int, groups: int) -> dict[WParam, int]:
    """The workspace slots of the parameter block for M rows: row sizes, region offsets and
    the bytes per thread (every region 64-byte aligned)."""
    def up(n: int) -> int:
        return -(-n // 64) * 64

    if spec.dot:  # x as int8 codes; per row: block scales, block code sums, group sums
        blocks = k // 32
        xrow, auxrow = up(k + 64), 2 * blocks + groups
    else:  # x as f32, groups padded to whole steps, a vector of slack; per row: group sums
        xrow, auxrow = 4 * (groups * spec.group_padded + spec.lanes), groups
    aux = up(m * xrow)
    scratch = aux + up(4 * m * auxrow)
    tmp = scratch + up(4 * spec.mt * spec.panels * spec.lanes)
    return {WParam.XROW: xrow, WParam.AUXROW: auxrow, WParam.AUX_OFF: aux,
            WParam.SCRATCH_OFF: scratch, WParam.TMP_OFF: tmp,
            WParam.WS_STRIDE: tmp + up(4 * (k + spec.lanes))}


# Bytes ahead of a step's codes that each step prefetches (its lines there). A GEMV of weights
# far larger than L3 (Qwen2.5-0.5B's head, 136 MB at int8) streamed at 20-25 GB/s without it and
# 26-33 GB/s with it on znver3 (the read probe: 38-43; 512 B ahead and 2-4 KiB were slower).
PREFETCH_AHEAD = 1024


def prefetch_step(b: ir.IRBuilder, step: ir.Value, step_bytes: int) -> None:
    """Prefetch the lines `PREFETCH_AHEAD` bytes past the step at `step` (a prefetch past the
    layout's end never faults)."""
    for line in range(0, step_bytes, 64):
        u.prefetch(b, u.gep(b, step, PREFETCH_AHEAD + line))


def registers(lanes: int) -> int:
    return 32 if lanes == 16 else 16


def rows_per_pass(lanes: int, panels: int) -> int:
    """Rows a tile pass keeps in one chain per panel and row (accumulators in memory), with a
    register for each row's broadcast of x and three for the decode (word, value, table)."""
    return max(1, (registers(lanes) - 3) // (panels + 1))


def accumulators_in_registers(lanes: int, panels: int, mt: int, chains: int) -> bool:
    """Whether a pass's group accumulators fit in registers beside its chains."""
    return mt * panels * (chains + 1) + mt + 4 <= registers(lanes)


def _splat_f(b: ir.IRBuilder, ptr: ir.Value, lanes: int) -> ir.Value:
    return u.splat(b, b.load(ptr, align=4), lanes)


def emit_float_tile(module: ir.Module, spec: WgemvSpec, mt: int) -> ir.Function:
    """tile(...): y[mt, P*L] (its first ncols columns) = xs[mt, :] @ the tile's chunks at w,
    with xs the f32 rows the float prologue wrote and aux each row's group sums."""
    fn = ir.Function(module, TILE_TYPE, name=f"tf_wtile_{mt}")
    fn.linkage = "internal"
    xs8, xrow8, sums, auxrow, ng, w, chunk, y, ldy, ncols, scratch = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    xs, xrow = b.bitcast(xs8, _FP), b.sdiv(xrow8, u.const(4))
    lanes, panels, dec = spec.lanes, spec.panels, spec.decoder
    vty = u.vec(u.f32, lanes)
    zero = u.zeros(vty)
    lut = lut_constant(dec)
    chains = 2 if mt == 1 else 1
    in_regs = accumulators_in_registers(lanes, panels, mt, chains)
    rows = [u.gep(b, xs, b.mul(u.const(m), xrow)) for m in range(mt)]
    sum_rows = [u.gep(b, sums, b.mul(u.const(m), auxrow)) for m in range(mt)]
    n_acc = mt * panels
    if not in_regs:
        for i in range(n_acc):
            b.store(zero, u.vptr(b, u.gep(b, scratch, i * lanes), lanes), align=4)
    step_bytes = panels * lanes * 4
    per_step = dec.per_step
    with u.for_range_carry(b, u.const(0), ng, 1, [zero] * n_acc if in_regs else [], "g") as gl:
        g = gl.index
        cptr = u.gep(b, w, b.mul(g, chunk))
        xg = [u.gep(b, rows[m], b.mul(g, u.const(spec.group_padded))) for m in range(mt)]
        inits = [zero] * (n_acc * chains)
        # One step a loop iteration: unrolling more made the scheduler hoist the decodes of
        # several steps and spill (AVX-512 from 4 rows a pass, AVX2 from one).
        with u.for_range_carry(b, u.const(0), u.const(spec.steps), 1, inits, "s") as sl:
            tmp = list(sl.values)
            s = sl.index
            sptr = u.gep(b, cptr, b.mul(s, u.const(step_bytes)))
            prefetch_step(b, sptr, step_bytes)
            xk = [u.gep(b, xg[m], b.mul(s, u.const(per_step))) for m in range(mt)]
            for v in range(panels):
                vptr = u.gep(b, sptr, v * lanes * 4)
                word = b.load(b.bitcast(vptr, u.vec(u.i32, lanes).as_pointer()), align=4)
                for j in range(per_step):
                    if dec.nibbles:
                        val, kk = decode_word(b, dec, word, j, lut, lanes), nibble_k(j)
                    else:
                        val, kk = decode_byte(b, dec, word, j, lanes), j
                    for m in range(mt):
                        i = (m * panels + v) * chains + j % chains
                        tmp[i] = u.fma(b, _splat_f(b, u.gep(b, xk[m], kk), lanes), val,
                                       tmp[i])
            sl.next = tmp
        acc = list(gl.values) if in_regs else [
            b.load(u.vptr(b, u.gep(b, scratch, i * lanes), lanes), align=4) for i in range(n_acc)]
        tail = u.gep(b, cptr, spec.code_bytes)
        factor = ir.Constant(vty, [dec.factor] * lanes)
        fix = bias_correction(dec, spec.corrected)
        sx = [_splat_f(b, u.gep(b, sum_rows[m], g), lanes) for m in range(mt)] \
            if spec.sums else []
        for v in range(panels):
            sc = load_scales(b, spec, tail, v)
            cr = load_corrections(b, spec, tail, v) if spec.corrected else None
            for m in range(mt):
                i = m * panels + v
                t = sl.result[i * chains]
                for c in range(1, chains):
                    t = b.fadd(t, sl.result[i * chains + c])
                if dec.factor != 1.0:
                    t = b.fmul(t, factor)
                if fix:
                    t = u.fma(b, sx[m], ir.Constant(vty, [float(fix)] * lanes), t)
                acc[i] = u.fma(b, t, sc, acc[i])
                if cr is not None:
                    acc[i] = u.fma(b, sx[m], cr, acc[i])
        keep_accumulators(b, gl, acc, in_regs, scratch, lanes)
    store_tile(b, final_accumulators(b, gl, in_regs, scratch, n_acc, lanes), y, ldy, ncols, mt,
               panels, lanes)
    b.ret_void()
    return fn


def store_tile(b: ir.IRBuilder, acc: list[ir.Value], y: ir.Value, ldy: ir.Value,
               ncols: ir.Value, mt: int, panels: int, lanes: int) -> None:
    """acc[m * panels + v] into y's row m, columns v*L.., only those below `ncols`."""
    for v in range(panels):
        left = u.smax(b, u.const(0), u.smin(b, u.const(lanes), b.sub(ncols, u.const(v * lanes))))
        mask = u.lane_mask(b, left, lanes)
        for m in range(mt):
            row = u.gep(b, y, b.add(b.mul(u.const(m), ldy), u.const(v * lanes)))
            u.masked_store(b, acc[m * panels + v], u.vptr(b, row, lanes), mask)


def load_scales(b: ir.IRBuilder, spec: WgemvSpec, tail: ir.Value, v: int) -> ir.Value:
    """Panel v's scales of the chunk whose scales start at `tail` (f16 widened, or f32)."""
    lanes = spec.lanes
    if spec.f16_scales:
        hty = u.vec(ir.HalfType(), lanes)
        raw = b.load(b.bitcast(u.gep(b, tail, v * lanes * 2), hty.as_pointer()), align=2)
        return b.fpext(raw, u.vec(u.f32, lanes))
    return b.load(u.vptr(b, b.bitcast(u.gep(b, tail, v * lanes * 4), _FP), lanes), align=4)


def load_corrections(b: ir.IRBuilder, spec: WgemvSpec, tail: ir.Value, v: int) -> ir.Value:
    """Panel v's corrections (f32, after the chunk's scales)."""
    at = u.gep(b, tail, spec.scale_bytes + v * spec.lanes * 4)
    return b.load(u.vptr(b, b.bitcast(at, _FP), spec.lanes), align=4)


def emit_float_prologue(module: ir.Module, spec: WgemvSpec) -> ir.Function:
    """prologue(...): xs[r, g*gp + i] = x[r, g*group + i] * x_scales[i % 8] (zeros where the
    group is padded), aux[r, g] = the group's sum of x. xs rows need `lanes` floats of slack."""
    fn = ir.Function(module, PROLOGUE_TYPE, name="tf_wx_prologue")
    fn.linkage = "internal"
    x, ldx, sxk, m, ng, k, xs8, xrow8, sums_ptr, auxrow, tmp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    xs, xrow = b.bitcast(xs8, _FP), b.sdiv(xrow8, u.const(4))
    lanes, group, group_padded, sums = spec.lanes, spec.group, spec.group_padded, spec.sums
    scales = x_scales(spec.decoder)
    vty = u.vec(u.f32, lanes)
    factors = None if scales is None else ir.Constant(
        vty, [float(scales[i % 8]) for i in range(lanes)])
    reduce = u.intrinsic(module, f"llvm.vector.reduce.fadd.v{lanes}f32", u.f32, [u.f32, vty])
    with u.for_range(b, u.const(0), m, 1, "r") as r:
        src = x_row(b, x, ldx, sxk, r, k, tmp)
        dst = u.gep(b, xs, b.mul(r, xrow))
        with u.for_range(b, u.const(0), ng, 1, "gg") as g:
            with u.for_range_carry(b, u.const(0), u.const(group_padded), lanes,
                                   [u.zeros(vty)], "i") as il:
                i = il.index
                mask = u.lane_mask(b, b.sub(u.const(group), i), lanes)
                at = b.add(b.mul(g, u.const(group)), i)
                v = u.masked_load(b, u.vptr(b, u.gep(b, src, at), lanes), mask, lanes)
                scaled = v if factors is None else b.fmul(v, factors)
                out = u.gep(b, dst, b.add(b.mul(g, u.const(group_padded)), i))
                b.store(scaled, u.vptr(b, out, lanes), align=4)
                il.next = [b.fadd(il.values[0], v)]
            if sums:
                total = b.call(reduce, [ir.Constant(u.f32, 0.0), il.result[0]])
                b.store(total, u.gep(b, sums_ptr, b.add(b.mul(r, auxrow), g)), align=4)
    b.ret_void()
    return fn


def x_row(b: ir.IRBuilder, x: ir.Value, ldx: ir.Value, sxk: ir.Value, r: ir.Value, k: ir.Value,
          tmp: ir.Value) -> ir.Value:
    """Row r of x as a contiguous f32 pointer: in place, or gathered into `tmp` when x's column
    stride is not 1."""
    src = u.gep(b, x, b.mul(r, ldx))
    contiguous = b.icmp_signed("==", sxk, u.const(1))
    with b.if_then(b.not_(contiguous)), u.for_range(b, u.const(0), k, 1, "kk") as kk:
        b.store(b.load(u.gep(b, src, b.mul(kk, sxk)), align=4), u.gep(b, tmp, kk), align=4)
    return b.select(contiguous, src, tmp)


def _emit_worker(module: ir.Module, spec: WgemvSpec, emit_tile, emit_prologue) -> ir.Function:
    """Thread body: the x prologue into this thread's workspace, then tiles [u0, u1) for all
    rows in passes of up to mt (`emit_tile(module, spec, mt)` makes each pass's function)."""
    tiles = [emit_tile(module, spec, mt) for mt in range(1, spec.mt + 1)]
    ptr = TILE_TYPE.as_pointer()
    table = ir.GlobalVariable(module, ir.ArrayType(ptr, len(tiles)), "tf_wtile_table")
    table.global_constant = True
    table.linkage = "internal"
    table.initializer = ir.Constant(ir.ArrayType(ptr, len(tiles)), tiles)
    prologue = emit_prologue(module, spec)
    wk = emit_worker(module, "tf_wgemv_worker", _FP, _I8P, _FP)
    b, x, w, y = wk.b, wk.x, wk.y, wk.z
    m, k, ng = wk[WParam.M], wk[WParam.K], wk[WParam.GROUPS]
    xrow, auxrow = wk[WParam.XROW], wk[WParam.AUXROW]
    chunk = wk[WParam.CHUNK]
    ws = u.gep(b, b.bitcast(wk.ws, _I8P), b.mul(wk.tid, wk[WParam.WS_STRIDE]))
    aux = b.bitcast(u.gep(b, ws, wk[WParam.AUX_OFF]), _FP)
    scratch = b.bitcast(u.gep(b, ws, wk[WParam.SCRATCH_OFF]), _FP)
    tmp = b.bitcast(u.gep(b, ws, wk[WParam.TMP_OFF]), _FP)
    b.call(prologue, [x, wk[WParam.LDX], wk[WParam.SXK], m, ng, k, ws, xrow, aux, auxrow, tmp])
    units = wk[WParam.TILES]
    u0 = b.sdiv(b.mul(units, wk.tid), wk.nth)
    u1 = b.sdiv(b.mul(units, b.add(wk.tid, u.const(1))), wk.nth)
    tile_bytes = b.mul(ng, chunk)
    width = spec.panels * spec.lanes
    n, ldy = wk[WParam.N], wk[WParam.LDY]
    with u.for_range(b, u0, u1, 1, "unit") as unit:
        col = b.mul(unit, u.const(width))
        w_t = u.gep(b, w, b.mul(unit, tile_bytes))
        with u.for_range(b, u.const(0), m, spec.mt, "m") as m0:
            rows = u.smin(b, u.const(spec.mt), b.sub(m, m0))
            slot = b.gep(table, [u.const(0, u.i32), b.trunc(b.sub(rows, u.const(1)), u.i32)])
            b.call(b.load(slot), [u.gep(b, ws, b.mul(m0, xrow)), xrow,
                                  u.gep(b, aux, b.mul(m0, auxrow)), auxrow, ng, w_t, chunk,
                                  u.gep(b, y, b.add(b.mul(m0, ldy), col)), ldy,
                                  b.sub(n, col), scratch])
    b.ret_void()
    return wk.fn


def module_ir(spec: WgemvSpec, target: Target, emit_tile, emit_prologue) -> str:
    """LLVM IR of a weight-only module: `tf_wgemv(params, x, layout_data, y, ws)`."""
    module = ir.Module(name=spec.name)
    module.triple = target.triple
    emit_entry(module, _emit_worker(module, spec, emit_tile, emit_prologue), ENTRY, WParam)
    return str(module)


def wgemv_ir(spec: WgemvSpec, target: Target) -> str:
    """LLVM IR of the float-decoding module for `spec`."""
    return module_ir(spec, target, emit_float_tile, emit_float_prologue)


def keep_accumulators(b: ir.IRBuilder, gl, acc: list, in_regs: bool, scratch, lanes: int
                      ) -> None:
    """A group's sums carried to the next group: the loop's values, or stored to scratch."""
    if in_regs:
        gl.next = acc
    else:
        for i, a in enumerate(acc):
            b.store(a, u.vptr(b, u.gep(b, scratch, i * lanes), lanes), align=4)


def final_accumulators(b: ir.IRBuilder, gl, in_regs: bool, scratch, n_acc: int, lanes: int
                       ) -> list:
    """The sums after the last group: the loop's results, or loaded from scratch."""
    if in_regs:
        return gl.result
    return [b.load(u.vptr(b, u.gep(b, scratch, i * lanes), lanes), align=4)
            for i in range(n_acc)]
