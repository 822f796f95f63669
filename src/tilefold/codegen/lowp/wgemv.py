"""Weight-only low-precision GEMV/skinny GEMM (M = 1..8 per pass) in LLVM IR.

y[M, N] = x[M, K] @ W[K, N] with W held as codes in column panels of L lanes, two k per step
(`panel_layout`), decoded in registers and never written back: each thread streams its panels
once. Per group of K: tmp = sum_k x[m, k] * code[k, n] in two chains (even and odd k), then
acc += tmp * scale[g, n] (+ zcorr[g, n] * sum_k x[m, k] for zero points).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.gemm.abi import ParamBlock, emit_entry, emit_worker
from tilefold.codegen.lowp.decode import (
    Decoder,
    decode_octet,
    decode_pair,
    lut_constant,
    octet_packed,
)
from tilefold.target import Target

ENTRY = "tf_wgemv"
# Bytes ahead each panel stream is prefetched: weights decoded from DRAM (a model larger than
# the cache) went from 17.5-18.1 to 21.1-26.3 GB/s on 1x4096x4096 int4 (1024: 19.9-23.8);
# cached weights run the same.
PREFETCH_BYTES = 512
_FP = u.f32.as_pointer()
_I8P = u.i8.as_pointer()
TILE_TYPE = ir.FunctionType(u.void, [_FP, u.i64, _I8P, _FP, _FP, _FP, u.i64, _FP, u.i64, u.i64])


class WParam(ParamBlock):
    """Slots of the int64 parameter block of `tf_wgemv`."""

    M = 0
    K = 1
    LDX = 2
    LDY = 3
    UNITS = 4
    GROUPS = 5
    THREADS = 6
    DATA_OFFSET = 7
    SCALE = 8
    ZCORR = 9
    SX = 10


@dataclass(frozen=True)
class WgemvSpec:
    """One compiled module: decoder, lanes, group size, rows per pass and panels per tile."""

    decoder: Decoder
    lanes: int
    group: int
    mt: int
    nv: int
    zero_point: bool

    @property
    def octets(self) -> bool:
        """Panels hold 8 k per 32-bit lane (`decode.octet_packed`)."""
        return octet_packed(self.lanes, self.group, self.decoder.nibbles)

    @property
    def name(self) -> str:
        zp = "_zp" if self.zero_point else ""
        d = self.decoder
        return f"wgemv_{d.code}_{d.method}_l{self.lanes}_g{self.group}_m{self.mt}x{self.nv}{zp}"


def _unroll(pairs: int) -> int:
    return next(f for f in (8, 4, 2, 1) if pairs % f == 0)


def _emit_tile(module: ir.Module, spec: WgemvSpec, mt: int) -> ir.Function:
    """tile(x, ldx, w, s, zc, sx, ng, y, ldy, k): y[mt, nv*L] = x[mt, k] @ panels."""
    fn = ir.Function(module, TILE_TYPE, name=f"tf_wtile_{mt}")
    fn.linkage = "internal"
    x, ldx, w, s, zc, sx, ng, y, ldy, k = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    lanes, nv, dec = spec.lanes, spec.nv, spec.decoder
    vty = u.vec(u.f32, lanes)
    zero = ir.Constant(vty, [0.0] * lanes)
    lut = lut_constant(dec)
    pair_bytes = dec.bytes_per_pair * lanes
    panel_bytes = b.mul(b.sdiv(k, u.const(2)), u.const(pair_bytes))
    panels = [u.gep(b, w, b.mul(u.const(v), panel_bytes)) for v in range(nv)]
    rows = [u.gep(b, x, b.mul(u.const(m), ldx)) for m in range(mt)]
    pairs = spec.group // 2
    unroll = _unroll(pairs)
    with u.for_range_carry(b, u.const(0), ng, 1, [zero] * (mt * nv), "g") as gl:
        g = gl.index
        k0 = b.mul(g, u.const(spec.group))
        inits = [zero] * (2 * mt * nv)
        with u.for_range_carry(b, u.const(0), u.const(pairs), unroll, inits, "kp") as kl:
            tmp = list(kl.values)
            for step in range(unroll):
                kp = b.add(kl.index, u.const(step))
                kk = b.add(k0, b.mul(kp, u.const(2)))
                byte_off = b.mul(b.sdiv(kk, u.const(2)), u.const(pair_bytes))
                if spec.octets and step % 4 == 0:
                    octets = [decode_octet(b, dec, u.gep(b, panels[v], byte_off), lut, lanes)
                              for v in range(nv)]
                    for v in range(nv):
                        u.prefetch(b, u.gep(b, panels[v],
                                            b.add(byte_off, u.const(PREFETCH_BYTES))))
                for v in range(nv):
                    if spec.octets:
                        lo, hi = octets[v][2 * (step % 4): 2 * (step % 4) + 2]
                    else:
                        lo, hi = decode_pair(b, dec, u.gep(b, panels[v], byte_off), lanes, lut)
                    for m in range(mt):
                        xe = u.splat(b, b.load(u.gep(b, rows[m], kk), align=4), lanes)
                        xo = u.splat(b, b.load(u.gep(b, rows[m], b.add(kk, u.const(1))),
                                               align=4), lanes)
                        i = 2 * (m * nv + v)
                        tmp[i] = u.fma(b, xe, lo, tmp[i])
                        tmp[i + 1] = u.fma(b, xo, hi, tmp[i + 1])
            kl.next = tmp
        acc = list(gl.values)
        factor = ir.Constant(vty, [dec.factor] * lanes)
        for v in range(nv):
            at = b.mul(b.add(b.mul(u.const(v), ng), g), u.const(lanes))
            sv = b.load(u.vptr(b, u.gep(b, s, at), lanes), align=4)
            zv = b.load(u.vptr(b, u.gep(b, zc, at), lanes), align=4) if spec.zero_point else None
            for m in range(mt):
                i = m * nv + v
                t = b.fadd(kl.result[2 * i], kl.result[2 * i + 1])
                if dec.factor != 1.0:
                    t = b.fmul(t, factor)
                acc[i] = u.fma(b, t, sv, acc[i])
                if zv is not None:
                    sxm = b.load(u.gep(b, sx, b.add(b.mul(u.const(m), ng), g)), align=4)
                    acc[i] = u.fma(b, u.splat(b, sxm, lanes), zv, acc[i])
        gl.next = acc
    for m in range(mt):
        row = u.gep(b, y, b.mul(u.const(m), ldy))
        for v in range(nv):
            b.store(gl.result[m * nv + v], u.vptr(b, u.gep(b, row, v * lanes), lanes), align=4)
    b.ret_void()
    return fn


def _emit_worker(module: ir.Module, spec: WgemvSpec) -> ir.Function:
    """Thread body: tiles [u0, u1) of nv panels, each for all rows in passes of up to mt."""
    tiles = [_emit_tile(module, spec, mt) for mt in range(1, spec.mt + 1)]
    ptr = TILE_TYPE.as_pointer()
    table = ir.GlobalVariable(module, ir.ArrayType(ptr, len(tiles)), "tf_wtile_table")
    table.global_constant = True
    table.linkage = "internal"
    table.initializer = ir.Constant(ir.ArrayType(ptr, len(tiles)), tiles)
    wk = emit_worker(module, "tf_wgemv_worker", _FP, _I8P, _FP)
    b, x, w, y = wk.b, wk.x, wk.y, wk.z
    m, k, ldx, ldy = wk[WParam.M], wk[WParam.K], wk[WParam.LDX], wk[WParam.LDY]
    ng = wk[WParam.GROUPS]
    s, zc, sx = (b.inttoptr(wk[slot], _FP) for slot in (WParam.SCALE, WParam.ZCORR, WParam.SX))
    units = wk[WParam.UNITS]
    tid64, nth64 = wk.tid, wk.nth
    u0 = b.sdiv(b.mul(units, tid64), nth64)
    u1 = b.sdiv(b.mul(units, b.add(tid64, u.const(1))), nth64)
    lanes, nv = spec.lanes, spec.nv
    tile_bytes = b.mul(b.mul(b.sdiv(k, u.const(2)), u.const(spec.decoder.bytes_per_pair * lanes)),
                       u.const(nv))
    with u.for_range(b, u0, u1, 1, "unit") as unit:
        col = b.mul(unit, u.const(nv * lanes))
        w_t = u.gep(b, w, b.mul(unit, tile_bytes))
        s_t = u.gep(b, s, b.mul(col, ng))
        zc_t = u.gep(b, zc, b.mul(col, ng))
        with u.for_range(b, u.const(0), m, spec.mt, "m") as m0:
            rows = u.smin(b, u.const(spec.mt), b.sub(m, m0))
            slot = b.gep(table, [u.const(0, u.i32), b.trunc(b.sub(rows, u.const(1)), u.i32)])
            b.call(b.load(slot), [u.gep(b, x, b.mul(m0, ldx)), ldx, w_t, s_t, zc_t,
                                  u.gep(b, sx, b.mul(m0, ng)), ng,
                                  u.gep(b, y, b.add(b.mul(m0, ldy), col)), ldy, k])
    b.ret_void()
    return wk.fn


def wgemv_ir(spec: WgemvSpec, target: Target) -> str:
    """LLVM IR of the module for `spec`: `tf_wgemv(params, x, w_panels, y, unused)`."""
    module = ir.Module(name=spec.name)
    module.triple = target.triple
    worker = _emit_worker(module, spec)
    emit_entry(module, worker, ENTRY, WParam)
    return str(module)
