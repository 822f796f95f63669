"""Decoding weight codes to f32 vectors in registers: one rule per code kind, chosen per target.

Codes come in *steps* of 4 * L bytes per column panel of L lanes (`codegen/llvm/lowp/wlayout.py`):
4-bit codes as one 32-bit word per lane holding 8 k (byte b: code k0 + b in its low nibble, code
k0 + 4 + b in its high one, so that masking the low or high nibbles gives the u8 quads an integer
dot product reads), 8-bit codes as one 32-bit word per lane holding k0 .. k0 + 3 (byte b: k0 + b,
the quad as it is). Integer 4-bit codes are stored unsigned, as the code plus 8 (GGUF's
Q4_0/Q4_1 nibbles as they are). A decoder turns position j of a step into one f32 vector; the
value may be the code times a power of two (`factor` undoes it once per group) or minus
`bias`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from tilefold import dtypes
from tilefold.codegen.llvm import util as u
from tilefold.target import Target

# The integer 4-bit table is the stored nibble shifted by a bias; fp4's is `fp4_table()`.
NIBBLE_STORE_OFFSET = 8  # integer 4-bit codes are stored as code + 8 (unsigned)


def fp4_table() -> np.ndarray:
    """fp4 e2m1 code -> value (f32), indexed by the stored nibble."""
    return np.arange(16, dtype=np.uint8).view(dtypes.fp4e2m1.np_dtype).astype(np.float32)


@dataclass(frozen=True)
class Decoder:
    """How codes of dtype `code` become f32 lanes. A stored integer nibble n decodes to
    n - `bias` (or to n * 16**j at position j with x pre-scaled by 16**-j: "offset4")."""

    code: str
    method: str  # "lut" (vpermps), "offset4", "minifloat", "int"
    factor: float = 1.0
    bias: int = 0

    @property
    def nibbles(self) -> bool:
        return self.code in ("i4", "fp4e2m1")

    @property
    def per_step(self) -> int:
        """k per step (one 32-bit word per lane)."""
        return 8 if self.nibbles else 4

    @property
    def tag(self) -> str:
        return f"{self.code}_{self.method}{self.bias or ''}"


def choose_decoder(code: str, target: Target, corrected: bool = False) -> Decoder:
    """The fastest decoder the target supports for `code` (i4, fp4e2m1, fp8e4m3, i8, u8);
    `corrected`: the weight has per-group corrections (zero points, offsets) of its own, which
    the layout computes for integer nibbles decoded without a bias."""
    if code == "i4" and target.has("avx512f"):
        return Decoder(code, "lut", bias=0 if corrected else NIBBLE_STORE_OFFSET)
    if code == "fp4e2m1" and target.has("avx512f"):
        return Decoder(code, "lut")
    if code == "i4":
        return Decoder(code, "offset4")
    if code == "fp4e2m1":
        return Decoder(code, "minifloat", 2.0**126)
    if code == "fp8e4m3":
        return Decoder(code, "minifloat", 2.0**120)
    if code == "i8":  # byte j moved to the top of its lane: the code times 2**24
        return Decoder(code, "int", 2.0**-24)
    return Decoder(code, "int")


def nibble_k(j: int) -> int:
    """k offset within its step of the nibble at bits 4j .. 4j+3 of a lane's word."""
    return j // 2 + 4 * (j % 2)


def bias_correction(dec: Decoder, corrected: bool) -> int:
    """What the decoded values of a symmetric integer 4-bit weight lack: decoded n - bias for a
    code n - 8, so each group adds (bias - 8) * sum(x) times its scale (0: nothing to add; a
    weight with corrections of its own has them in its corrections)."""
    return dec.bias - NIBBLE_STORE_OFFSET if dec.code == "i4" and not corrected else 0


def x_scales(dec: Decoder) -> np.ndarray | None:
    """What x[k] is multiplied by, by k's offset within its step, before an "offset4" kernel
    reads it (None for the other decoders): that decoder converts nibble j in place, as
    n * 16**j, so x[k] comes scaled by 16**-j (exact: a power of two); the top nibble (j = 7,
    at the sign bit) is shifted down instead."""
    if dec.method != "offset4":
        return None
    out = np.ones(8, np.float32)
    for j in range(7):
        out[nibble_k(j)] = 16.0**-j
    return out


def _i32(value: int, lanes: int) -> ir.Constant:
    return ir.Constant(u.vec(u.i32, lanes), [value] * lanes)


def _fp4_bits(b: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    """f32 bits of the fp4 code in the low 4 bits of each i32 lane: sign to bit 31,
    exponent|mantissa below f32's exponent field."""
    mag = b.shl(b.and_(x, _i32(7, lanes)), _i32(22, lanes))
    sign = b.shl(b.and_(x, _i32(8, lanes)), _i32(28, lanes))
    return b.bitcast(b.or_(mag, sign), u.vec(u.f32, lanes))


def lut_constant(dec: Decoder) -> ir.Constant | None:
    """The vpermps table operand, or None when the decoder needs none."""
    if dec.method != "lut":
        return None
    table = fp4_table() if dec.code == "fp4e2m1" else np.arange(16) - dec.bias
    return ir.Constant(u.vec(u.f32, 16), [float(v) for v in table])


def decode_word(b: ir.IRBuilder, dec: Decoder, word: ir.Value, j: int, lut: ir.Constant | None,
                lanes: int) -> ir.Value:
    """Nibble j (bits 4j .. 4j+3) of each lane of the i32 vector `word` as f32."""
    fty = u.vec(u.f32, lanes)
    if dec.method == "offset4":  # masked in place: n * 16**j; the top nibble shifted down
        if j == 7:
            return b.sitofp(b.lshr(word, _i32(28, lanes)), fty)
        return b.sitofp(b.and_(word, _i32(15 << 4 * j, lanes)), fty)
    shifted = b.lshr(word, _i32(4 * j, lanes)) if j else word
    if dec.method == "lut":  # vpermps reads only the low 4 bits of each index
        fn = u.intrinsic(b.module, "llvm.x86.avx512.permvar.sf.512", u.vec(u.f32, 16),
                         [u.vec(u.f32, 16), u.vec(u.i32, 16)])
        return b.call(fn, [lut, shifted])
    return _fp4_bits(b, shifted, lanes)


def decode_byte(b: ir.IRBuilder, dec: Decoder, word: ir.Value, j: int, lanes: int) -> ir.Value:
    """Byte j of each lane of the i32 vector `word` (8-bit codes) as f32, by one in-lane byte
    shuffle (`vpshufb`) and a conversion: u8 codes moved to the lane's low byte, signed and
    minifloat ones to its top byte (an i8 code c reads c * 2**24, which the decoder's `factor`
    undoes; an fp8 code's sign lands on the f32 sign bit)."""
    bytes_ty, i32v, fty = u.vec(u.i8, 4 * lanes), u.vec(u.i32, lanes), u.vec(u.f32, lanes)
    at = 0 if dec.code == "u8" else 3
    zero = 4 * lanes  # an index into the second (zero) operand
    order = [4 * (i // 4) + j if i % 4 == at else zero for i in range(4 * lanes)]
    moved = b.bitcast(b.shuffle_vector(b.bitcast(word, bytes_ty), u.zeros(bytes_ty),
                                       ir.Constant(u.vec(u.i32, 4 * lanes), order)), i32v)
    if dec.method == "minifloat":  # sign at bit 31, exponent|mantissa at bits 20 .. 26
        bits = b.and_(b.ashr(moved, _i32(4, lanes)), _i32(0x87F00000 - (1 << 32), lanes))
        return b.bitcast(bits, fty)
    return b.sitofp(moved, fty)
