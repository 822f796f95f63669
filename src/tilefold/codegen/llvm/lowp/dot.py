"""Packed dot-product steps: acc[L] += sum over a k-group of A(broadcast) * B(per lane).

A k-group is one 32-bit word per lane: two bf16 or f16 (`vdpbf16ps` order), four 8-bit codes
(`vpdpbusd` order: A unsigned, B signed), or two 8-bit codes already widened to s16 by packing.
Each step exists as the ISA instruction and as a portable fallback with the same result (bf16
products are exact in f32; 8-bit products are widened to i16 and summed by `pmaddwd`, which
never saturates, unlike `pmaddubsw`).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tilefold.codegen.llvm import util as u

DotStep = Callable[[ir.IRBuilder, ir.Value, ir.Value, ir.Value], ir.Value]


def _vi(bits: int, lanes: int) -> ir.VectorType:
    return u.vec(ir.IntType(bits), lanes)


def _c(ty: ir.VectorType, value: int) -> ir.Constant:
    return ir.Constant(ty, [value] * ty.count)


class BFloat(ir.Type):
    """LLVM's `bfloat` (llvmlite has no such type; the intrinsic takes <32 x bfloat>)."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


def dpbf16(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """`vdpbf16ps` (AVX512_BF16): a, bv are <16 x i32> of bf16 pairs."""
    bf = ir.VectorType(BFloat(), 32)
    fn = u.intrinsic(b.module, "llvm.x86.avx512bf16.dpbf16ps.512", acc.type,
                     [acc.type, bf, bf])
    return b.call(fn, [acc, b.bitcast(a, bf), b.bitcast(bv, bf)])


def bf16_pairs_as_f32(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(even, odd) f32 vectors of the bf16 pairs in i32 lanes: a bf16 is an f32's high half."""
    fty = u.vec(u.f32, x.type.count)
    even = b.bitcast(b.shl(x, _c(x.type, 16)), fty)
    odd = b.bitcast(b.and_(x, _c(x.type, -65536)), fty)
    return even, odd


def dpbf16_fma(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """Portable bf16 pair dot: two f32 FMAs (exact products, so only the rounding order differs
    from `vdpbf16ps`)."""
    ae, ao = bf16_pairs_as_f32(b, a)
    be, bo = bf16_pairs_as_f32(b, bv)
    return u.fma(b, ao, bo, u.fma(b, ae, be, acc))


def dpf16_fma(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """f16 pair dot: `vcvtph2ps` (F16C / AVX-512) of the even and odd halves, two f32 FMAs."""
    lanes = acc.type.count
    halves = u.vec(ir.HalfType(), 2 * lanes)

    def split(x):
        h = b.bitcast(x, halves)
        return [b.fpext(b.shuffle_vector(h, ir.Constant(halves, None), ir.Constant(
            u.vec(u.i32, lanes), list(range(parity, 2 * lanes, 2)))), acc.type)
            for parity in (0, 1)]

    (ae, ao), (be, bo) = split(a), split(bv)
    return u.fma(b, ao, bo, u.fma(b, ae, be, acc))


def dpbusd(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """`vpdpbusd` (AVX512_VNNI): u8 quads of `a` times s8 quads of `bv`, summed into i32."""
    lanes = acc.type.count
    bytes_ty = _vi(8, 4 * lanes)
    fn = u.intrinsic(b.module, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", acc.type,
                     [acc.type, bytes_ty, bytes_ty])
    return b.call(fn, [acc, b.bitcast(a, bytes_ty), b.bitcast(bv, bytes_ty)])


def dpbusd_pmaddwd(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """Portable u8 x s8 quad dot: split bytes into i16 lanes and `pmaddwd` twice (exact)."""
    lanes = acc.type.count
    w16 = _vi(16, 2 * lanes)
    a16, b16 = b.bitcast(a, w16), b.bitcast(bv, w16)
    a_lo = b.and_(a16, _c(w16, 0xFF))
    a_hi = b.lshr(a16, _c(w16, 8))
    b_lo = b.ashr(b.shl(b16, _c(w16, 8)), _c(w16, 8))
    b_hi = b.ashr(b16, _c(w16, 8))
    name = "llvm.x86.avx512.pmaddw.d.512" if lanes == 16 else "llvm.x86.avx2.pmadd.wd"
    fn = u.intrinsic(b.module, name, acc.type, [w16, w16])
    return b.add(acc, b.add(b.call(fn, [a_lo, b_lo]), b.call(fn, [a_hi, b_hi])))


def _maddubs(b: ir.IRBuilder, a: ir.Value, bv: ir.Value, lanes: int) -> ir.Value:
    """`pmaddubsw`: u8 bytes of `a` times s8 bytes of `bv`, adjacent pairs summed to s16
    (saturating: callers keep each pair's sum inside s16)."""
    bytes_ty, w16 = _vi(8, 4 * lanes), _vi(16, 2 * lanes)
    name = "llvm.x86.avx512.pmaddubs.w.512" if lanes == 16 else "llvm.x86.avx2.pmadd.ub.sw"
    fn = u.intrinsic(b.module, name, w16, [bytes_ty, bytes_ty])
    return b.call(fn, [b.bitcast(a, bytes_ty), b.bitcast(bv, bytes_ty)])


def _pairs_to_i32(b: ir.IRBuilder, acc: ir.Value, pairs: ir.Value) -> ir.Value:
    """acc + the s16 pairs of `pairs` summed per 32-bit lane (`pmaddwd` by ones, exact)."""
    lanes = acc.type.count
    w16 = _vi(16, 2 * lanes)
    name = "llvm.x86.avx512.pmaddw.d.512" if lanes == 16 else "llvm.x86.avx2.pmadd.wd"
    fn = u.intrinsic(b.module, name, acc.type, [w16, w16])
    return b.add(acc, b.call(fn, [pairs, _c(w16, 1)]))


def dpbusd_maddubs(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """u8 x s8 quad dot without VNNI (AVX2 / AVX512BW): `pmaddubsw`, then `pmaddwd` by ones.
    Exact only where each pair's sum fits s16, as for 4-bit codes: 2 * 15 * 127 < 2**15."""
    return _pairs_to_i32(b, acc, _maddubs(b, a, bv, acc.type.count))


def dpbssd_maddubs(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """s8 x s8 quad dot without VNNI: |a| (u8) times bv carrying a's sign (`vpsignb` on AVX2),
    by `pmaddubsw` and `pmaddwd`. Exact for |bv| <= 127 (int8 activations): a pair's sum is
    at most 2 * 128 * 127 < 2**15."""
    lanes = acc.type.count
    bytes_ty = _vi(8, 4 * lanes)
    a8, b8 = b.bitcast(a, bytes_ty), b.bitcast(bv, bytes_ty)
    absolute = b.call(u.intrinsic(b.module, f"llvm.abs.v{4 * lanes}i8", bytes_ty,
                                  [bytes_ty, ir.IntType(1)]), [a8, ir.Constant(ir.IntType(1), 0)])
    if lanes == 8:
        sign = u.intrinsic(b.module, "llvm.x86.avx2.psign.b", bytes_ty, [bytes_ty, bytes_ty])
        signed = b.call(sign, [b8, a8])
    else:
        negative = b.icmp_signed("<", a8, _c(bytes_ty, 0))
        signed = b.select(negative, b.sub(_c(bytes_ty, 0), b8), b8)
    return _pairs_to_i32(b, acc, _maddubs(b, absolute, signed, lanes))


def quad_dot(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value,
             signed_a: bool) -> ir.Value:
    """8-bit quads in plain vector code (any ISA): each byte of `a` (u8, or s8 with `signed_a`)
    times the s8 byte of `bv` in its place, the four products of a lane added to it in i32."""
    lanes = acc.type.count
    bytes_ty, wide = _vi(8, 4 * lanes), _vi(32, 4 * lanes)
    ax = b.bitcast(a, bytes_ty)
    ax = b.sext(ax, wide) if signed_a else b.zext(ax, wide)
    products = b.mul(ax, b.sext(b.bitcast(bv, bytes_ty), wide))
    for q in range(4):
        pick = ir.Constant(_vi(32, lanes), [4 * j + q for j in range(lanes)])
        acc = b.add(acc, b.shuffle_vector(products, ir.Constant(wide, ir.Undefined), pick))
    return acc


def pmaddwd(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, bv: ir.Value) -> ir.Value:
    """s16 pair dot (AVX2 `vpmaddwd` + `vpaddd`): a, bv hold two s16 codes a 32-bit lane, as
    packing widened u8/s8 to them; |a0 b0 + a1 b1| <= 2 * 255 * 128 < 2**31, so it is exact."""
    w16 = _vi(16, 2 * acc.type.count)
    fn = u.intrinsic(b.module, "llvm.x86.avx2.pmadd.wd", acc.type, [w16, w16])
    return b.add(acc, b.call(fn, [b.bitcast(a, w16), b.bitcast(bv, w16)]))


DOT_STEPS: dict[str, DotStep] = {
    "dpbf16": dpbf16,
    "dpbf16_fma": dpbf16_fma,
    "dpf16_fma": dpf16_fma,
    "dpbusd": dpbusd,
    "dpbusd_pmaddwd": dpbusd_pmaddwd,
    "pmaddwd": pmaddwd,
}
