"""Decoding weight codes to f32 vectors in registers: one rule per code kind, chosen per target.

A decoder turns the bytes of one k-pair of a column panel (L lanes) into two f32 vectors (codes
k and k+1). Values may come out scaled by a power of two (`factor` undoes it, once per group):
minifloats are decoded by moving their bits into an f32 and rebiasing the exponent later.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.target import Target

# 4-bit code -> value, indexed by the nibble (low 4 bits).
NIBBLE_TABLES = {
    "i4": np.array([v - 16 if v > 7 else v for v in range(16)], np.float32),
    "fp4e2m1": np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32),
}


@dataclass(frozen=True)
class Decoder:
    """How codes of dtype `code` become f32 lanes; `nibbles` codes pack two per byte. Codes
    may be stored plus `offset` (mod 16): the kernel then subtracts offset * sum(x) per group,
    as it does for zero points."""

    code: str
    method: str  # "lut" (vpermps), "offset4", "sext4", "minifloat", "int"
    nibbles: bool
    factor: float = 1.0
    offset: int = 0

    @property
    def bytes_per_pair(self) -> int:
        """Bytes per lane holding codes k and k+1."""
        return 1 if self.nibbles else 2


def choose_decoder(code: str, target: Target, octets: bool = False) -> Decoder:
    """The fastest decoder the target supports for `code` (i4, fp4e2m1, fp8e4m3, i8, u8);
    `octets`: the weight's panels hold 8 k per 32-bit lane (`octet_packed`) and it has no zero
    points of its own."""
    nibbles = code in NIBBLE_TABLES
    if nibbles and target.has("avx512f"):
        return Decoder(code, "lut", True)
    if code == "i4" and octets:
        return Decoder(code, "offset4", True, offset=8)
    if code == "i4":
        return Decoder(code, "sext4", True)
    if code == "fp4e2m1":
        return Decoder(code, "minifloat", True, 2.0**126)
    if code == "fp8e4m3":
        return Decoder(code, "minifloat", False, 2.0**120)
    return Decoder(code, "int", False)


def _i32(b, value, lanes):
    return ir.Constant(u.vec(u.i32, lanes), [value] * lanes)


def _minifloat_bits(b, x, code: str, lanes: int):
    """f32 bits of a minifloat code held in the low bits of each i32 lane (x: sign-extended for
    fp8, a bare nibble for fp4): sign to bit 31, exponent|mantissa below f32's exponent field."""
    if code == "fp8e4m3":
        bits = b.and_(b.shl(x, _i32(b, 20, lanes)), _i32(b, 0x87F00000 - (1 << 32), lanes))
    else:
        mag = b.shl(b.and_(x, _i32(b, 7, lanes)), _i32(b, 22, lanes))
        sign = b.shl(b.and_(x, _i32(b, 8, lanes)), _i32(b, 28, lanes))
        bits = b.or_(mag, sign)
    return b.bitcast(bits, u.vec(u.f32, lanes))


def _one(b: ir.IRBuilder, dec: Decoder, x, lanes: int, lut):
    """One vector of f32 values from codes in the low bits of the i32 lanes of `x`."""
    if dec.method == "lut":
        fn = u.intrinsic(b.module, "llvm.x86.avx512.permvar.sf.512", u.vec(u.f32, 16),
                         [u.vec(u.f32, 16), u.vec(u.i32, 16)])
        return b.call(fn, [lut, x])
    if dec.method == "sext4":
        nib = b.and_(x, _i32(b, 15, lanes))
        return b.sitofp(b.sub(b.xor(nib, _i32(b, 8, lanes)), _i32(b, 8, lanes)),
                        u.vec(u.f32, lanes))
    if dec.method == "minifloat":
        return _minifloat_bits(b, x, dec.code, lanes)
    return b.sitofp(x, u.vec(u.f32, lanes))


def lut_constant(dec: Decoder) -> ir.Constant | None:
    """The vpermps table operand, or None when the decoder needs none."""
    if dec.method != "lut":
        return None
    return ir.Constant(u.vec(u.f32, 16), [float(v) for v in NIBBLE_TABLES[dec.code]])


def decode_pair(b: ir.IRBuilder, dec: Decoder, ptr: ir.Value, lanes: int,
                lut: ir.Constant | None) -> tuple[ir.Value, ir.Value]:
    """(codes k, codes k+1) as f32 vectors from the `bytes_per_pair * lanes` bytes at `ptr`."""
    byte_vec = u.vec(u.i8, lanes)
    i32v = u.vec(u.i32, lanes)
    signed = dec.code in ("i8", "fp8e4m3")

    def load(offset):
        p = b.bitcast(u.gep(b, ptr, offset), byte_vec.as_pointer())
        raw = b.load(p, align=1)
        return b.sext(raw, i32v) if signed else b.zext(raw, i32v)

    if dec.nibbles:
        both = load(0)
        return (_one(b, dec, both, lanes, lut),
                _one(b, dec, b.lshr(both, _i32(b, 4, lanes)), lanes, lut))
    return _one(b, dec, load(0), lanes, lut), _one(b, dec, load(lanes), lanes, lut)


def octet_packed(lanes: int, group: int, nibbles: bool) -> bool:
    """Whether panels hold 8 k per 32-bit lane (nibble j = code k0 + j) instead of k-pairs per
    byte: one full-width load feeds 8 decodes, where byte pairs take a zero-extending load per
    2 decodes. With a 16-entry `vpermps` table (which reads only the low 4 index bits) a decode
    is a shift and the permute; signed int4 on AVX2 ("offset4", codes stored + 8, x pre-scaled
    by 16**-j) is a mask of the nibble in place and its conversion. On Zen 1 (vector shifts on
    one pipe) that ran 1x4096x4096 at 3.4-3.8 GB/s of packed weights, where two shifts a nibble
    (the sign extended in place) ran 3.0; building the float from 2**23's bits instead of
    converting gained nothing."""
    return nibbles and group % 8 == 0


def octet_x_scales(dec: Decoder) -> np.ndarray | None:
    """What x[k] is multiplied by, by k mod 8, before an "offset4" kernel reads it (None for
    the other decoders): that decoder converts nibble j in place, as u * 16**j, so x[k] comes
    scaled by 16**-j (exact: a power of two); nibble 7, at the sign bit, is shifted down."""
    if dec.method != "offset4":
        return None
    return np.array([16.0 ** -j for j in range(7)] + [1.0], np.float32)


def decode_octet(b: ir.IRBuilder, dec: Decoder, ptr: ir.Value, lut: ir.Constant | None,
                 lanes: int) -> list[ir.Value]:
    """Codes k0 .. k0+7 of `lanes` lanes as f32 vectors from the octet-packed words at `ptr`."""
    i32v = u.vec(u.i32, lanes)
    fty = u.vec(u.f32, lanes)
    words = b.load(b.bitcast(ptr, i32v.as_pointer()), align=4)
    if dec.method == "offset4":  # codes + 8 (unsigned): masked in place, converted (u * 16**j)
        return [b.sitofp(b.and_(words, _i32(b, 15 << 4 * j, lanes)), fty) for j in range(7)] + [
            b.sitofp(b.lshr(words, _i32(b, 28, lanes)), fty)]
    if dec.method == "sext4":  # nibble j to the top, then back down with its sign
        return [b.sitofp(b.ashr(b.shl(words, _i32(b, 28 - 4 * j, lanes)) if j < 7 else words,
                                _i32(b, 28, lanes)), u.vec(u.f32, lanes)) for j in range(8)]
    return [_one(b, dec, b.lshr(words, _i32(b, 4 * j, lanes)) if j else words, lanes, lut)
            for j in range(8)]
