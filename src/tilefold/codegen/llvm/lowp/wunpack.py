"""Decoding a weight-only weight into the f32 GEMM's pre-packed B panels, for many-row products.

A prompt (M = 64 .. 512 rows) is compute-bound: the f32 GEMM's register tiles reuse each B
value M times, where the GEMV would decode it once per pass of a few rows. So a weight in the
stream layout (`wlayout.py`) is decoded once per call, with its scales and corrections applied,
into `PackedMatrix` panels (NR columns by K rows, the last panel as wide as the rest of N in
whole vectors), and the f32 GEMM then runs as with a pre-packed f32 weight. Threads split the
tiles; a lane vector of a tile lands in one panel row (NR is a multiple of the vector width).
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
from tilefold.codegen.llvm.lowp.wgemv import ChunkGeometry, load_corrections, load_scales
from tilefold.target import Target

ENTRY = "tf_wunpack"
_FP = u.f32.as_pointer()
_I8P = u.i8.as_pointer()


class UParam(ParamBlock):
    """Slots of the int64 parameter block of `tf_wunpack`."""

    K = 0
    N = 1
    TILES = 2
    GROUPS = 3
    CHUNK = 4
    NFULL = 5  # columns in full NR-wide panels
    WLAST = 6  # width of the last, narrower panel
    THREADS = 7
    DATA_OFFSET = 8


@dataclass(frozen=True)
class UnpackSpec(ChunkGeometry):
    """One compiled decoder into panels of `nr` columns."""

    decoder: Decoder
    lanes: int
    panels: int
    group: int
    f16_scales: bool
    corrected: bool
    nr: int

    @property
    def name(self) -> str:
        flags = ("h" if self.f16_scales else "f") + ("c" if self.corrected else "")
        return (f"wunpack_{self.decoder.tag}_l{self.lanes}p{self.panels}_g{self.group}_"
                f"nr{self.nr}{flags}")


def _multipliers(dec: Decoder) -> list[float]:
    """What position j's decoded value is multiplied by besides the scale: 16**-j for
    "offset4" (nibble j converted in place), the minifloat rebias, else 1."""
    scales = x_scales(dec)
    if scales is not None:
        return [float(scales[nibble_k(j)]) for j in range(8)]
    return [dec.factor] * dec.per_step


def _emit_worker(module: ir.Module, spec: UnpackSpec) -> ir.Function:
    wk = emit_worker(module, "tf_wunpack_worker", _I8P, _FP, _FP)
    b, w, dst = wk.b, wk.x, wk.y
    lanes, panels, dec = spec.lanes, spec.panels, spec.decoder
    k, n, ng, chunk = wk[UParam.K], wk[UParam.N], wk[UParam.GROUPS], wk[UParam.CHUNK]
    n_full, w_last = wk[UParam.NFULL], wk[UParam.WLAST]
    units = wk[UParam.TILES]
    u0 = b.sdiv(b.mul(units, wk.tid), wk.nth)
    u1 = b.sdiv(b.mul(units, b.add(wk.tid, u.const(1))), wk.nth)
    fty = u.vec(u.f32, lanes)
    lut = lut_constant(dec)
    mults = _multipliers(dec)
    fix = bias_correction(dec, spec.corrected)
    width = panels * lanes
    n_vec = b.mul(b.sdiv(b.add(n, u.const(lanes - 1)), u.const(lanes)), u.const(lanes))
    step_bytes = panels * lanes * 4
    with u.for_range(b, u0, u1, 1, "unit") as unit:
        w_t = u.gep(b, w, b.mul(unit, b.mul(ng, chunk)))
        bases, strides, live = [], [], []
        for v in range(panels):  # where panel v's columns land, and its row stride
            c0 = b.add(b.mul(unit, u.const(width)), u.const(v * lanes))
            full = b.icmp_signed("<", c0, n_full)
            p = b.sdiv(c0, u.const(spec.nr))
            in_full = b.add(b.mul(b.mul(p, u.const(spec.nr)), k),
                            b.sub(c0, b.mul(p, u.const(spec.nr))))
            in_last = b.add(b.mul(n_full, k), b.sub(c0, n_full))
            bases.append(u.gep(b, dst, b.select(full, in_full, in_last)))
            strides.append(b.select(full, u.const(spec.nr), w_last))
            live.append(b.icmp_signed("<", c0, n_vec))
        with u.for_range(b, u.const(0), ng, 1, "g") as g:
            cptr = u.gep(b, w_t, b.mul(g, chunk))
            tail = u.gep(b, cptr, spec.code_bytes)
            for v in range(panels):
                with b.if_then(live[v]):
                    sc = load_scales(b, spec, tail, v)
                    add = load_corrections(b, spec, tail, v) if spec.corrected else \
                        b.fmul(sc, ir.Constant(fty, [float(fix)] * lanes))
                    muls = [b.fmul(sc, ir.Constant(fty, [m] * lanes)) for m in mults]
                    with u.for_range(b, u.const(0), u.const(spec.steps), 1, "s") as s:
                        sptr = u.gep(b, cptr, b.add(b.mul(s, u.const(step_bytes)),
                                                    u.const(v * lanes * 4)))
                        word = b.load(b.bitcast(sptr, u.vec(u.i32, lanes).as_pointer()),
                                      align=4)
                        for j in range(dec.per_step):
                            kk = nibble_k(j) if dec.nibbles else j
                            in_group = b.add(b.mul(s, u.const(dec.per_step)), u.const(kk))
                            val = decode_word(b, dec, word, j, lut, lanes) if dec.nibbles \
                                else decode_byte(b, dec, word, j, lanes)
                            out = u.fma(b, val, muls[j], add)
                            row = b.add(b.mul(g, u.const(spec.group)), in_group)
                            at = u.gep(b, bases[v], b.mul(row, strides[v]))
                            if spec.group % dec.per_step:  # a padded group's last step
                                with b.if_then(b.icmp_signed("<", in_group,
                                                             u.const(spec.group))):
                                    b.store(out, u.vptr(b, at, lanes), align=4)
                            else:
                                b.store(out, u.vptr(b, at, lanes), align=4)
    b.ret_void()
    return wk.fn


def wunpack_ir(spec: UnpackSpec, target: Target) -> str:
    """LLVM IR of `tf_wunpack(params, layout_data, packed_b, packed_b, ws)`."""
    module = ir.Module(name=spec.name)
    module.triple = target.triple
    emit_entry(module, _emit_worker(module, spec), ENTRY, UParam)
    return str(module)
