"""exp and log for f32: Cody-Waite range reduction around Cephes minimax polynomials."""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm.vecmath.builder import MathBuilder

LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = HI + LO, HI exact in 9 bits
ROUNDER = 12582912.0  # 1.5 * 2**23: x + ROUNDER rounds x to an integer kept in the low bits
# Arguments are clamped to [EXP_MIN, EXP_MAX]: e**EXP_MAX overflows; below EXP_MIN the
# mantissa is 0, and above it the two scale factors stay normal even when a caller folds a
# factor up to 2**128 into the mantissa (x * e**v in silu/gelu must not underflow early).
EXP_MIN, EXP_MAX = -174.0, 89.0
# e**r = 1 + r + r**2 * P(r) on |r| <= ln2/2 (Cephes expf).
EXP_P = (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
         1.3981999507e-3, 1.9875691500e-4)
# log(1+f) = f - f**2/2 + f**3 * Q(f) on sqrt(1/2)-1 <= f < sqrt(2)-1 (Cephes logf).
LOG_Q = (3.3333331174e-1, -2.4999993993e-1, 2.0000714765e-1, -1.6668057665e-1,
         1.4249322787e-1, -1.2420140846e-1, 1.1676998740e-1, -1.1514610310e-1,
         7.0376836292e-2)
SQRT2 = 1.41421356237
TINY = 1.17549435e-38  # 2**-126, the smallest normal f32


def _reduce(m: MathBuilder, x: ir.Value, lo: ir.Value | None, rounder: float = ROUNDER
            ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """e**(x + lo) = er * 2**n for x in [EXP_MIN, EXP_MAX]: (v, n, er), n as a float and as the
    low bits of v = n + `rounder` (ROUNDER, or ROUNDER + a bias to add to n for free)."""
    b = m.b
    v = m.mad(x, m.c(LOG2E), m.c(rounder))
    n = b.fsub(v, m.c(rounder))
    r = m.mad(n, m.c(-LN2_HI), x)
    r = m.mad(n, m.c(-LN2_LO), r)
    if lo is not None:
        r = b.fadd(r, lo)
    return v, n, b.fadd(m.mad(m.poly(r, EXP_P), b.fmul(r, r), r), m.c(1.0))


def exp_parts(m: MathBuilder, x: ir.Value, lo: ir.Value | None = None) -> tuple[ir.Value, ir.Value]:
    """e**(x + lo) as (mantissa, scale), both normal floats, whose product is the result.

    The scale 2**n is split in two factors so that subnormal results round once, in the
    caller's final multiply; callers may fold another factor into the mantissa first.
    `lo` (|lo| << ulp(x)) carries extra argument precision into the reduced argument.
    """
    b = m.b
    vanishing = m.cmp("<", x, m.c(EXP_MIN))
    v, _, er = _reduce(m, m.clamp(x, EXP_MIN, EXP_MAX), lo)
    er = m.select(vanishing, m.c(0.0), er)
    k = b.sub(m.bits(v), m.bits(m.c(ROUNDER)))  # n as an integer in [-251, 128]
    k1 = b.ashr(k, m.ic(1))
    k2 = b.sub(k, k1)
    s1 = m.floats(b.shl(b.add(k1, m.ic(127)), m.ic(23)))
    s2 = m.floats(b.shl(b.add(k2, m.ic(127)), m.ic(23)))
    return b.fmul(er, s1), s2


def exp_scalef(m: MathBuilder, x: ir.Value, lo: ir.Value | None = None
               ) -> tuple[ir.Value, ir.Value]:
    """e**(x + lo) = er * 2**n as (er, n) for `m.scale` (vscalefps), which rounds a subnormal
    result once; callers may fold factors into er first. x must lie in [EXP_MIN, EXP_MAX]."""
    _, n, er = _reduce(m, x, lo)
    return er, n


def exp(m: MathBuilder, x: ir.Value) -> ir.Value:
    if not m.scalef:
        mantissa, scale = exp_parts(m, x)
        return m.b.fmul(mantissa, scale)
    er, n = exp_scalef(m, m.clamp(x, -104.0, EXP_MAX))  # below, e**x rounds to 0
    return m.scale(er, n)


# The f32 nearest above ln(2**-126): e**x is normal from here up, and `exp_nonpositive`
# gives 0 below.
EXP_FLUSH = -87.33654


def exp_nonpositive(m: MathBuilder, x: ir.Value) -> ir.Value:
    """e**x for x <= 0, the shifted scores of a softmax: within exp's bound (1 ulp) where the
    result is normal, 0 below EXP_FLUSH (an absolute error under 2**-126) and at -inf, NaN for
    NaN. Half of `exp`'s operations: the scale 2**n is one shift of v's low bits, which hold
    n + 127 >= 1 (ROUNDER + 127 shifts the biased exponent in). Flushed lanes compute at
    EXP_FLUSH, so no lane ever meets a subnormal (whose microcode assists cost 4x on masked
    attention rows)."""
    b = m.b
    low = m.cmp("<", x, m.c(EXP_FLUSH))
    x = m.select(low, m.c(EXP_FLUSH), x)
    v, _, er = _reduce(m, x, None, ROUNDER + 127)
    y = b.fmul(er, m.floats(b.shl(m.bits(v), m.ic(23))))
    return m.select(low, m.c(0.0), y)


def log(m: MathBuilder, x: ir.Value) -> ir.Value:
    """Natural log: x = 2**e * (1+f); log = e*ln2 + log1p(f); subnormals pre-scaled by 2**23."""
    b = m.b
    tiny = m.cmp("<", x, m.c(TINY))
    xs = m.select(tiny, b.fmul(x, m.c(8388608.0)), x)
    bits = m.bits(xs)
    e = b.sub(b.lshr(bits, m.ic(23)), m.ic(127))
    mant = m.floats(b.or_(b.and_(bits, m.ic(0x7FFFFF)), m.ic(0x3F800000)))
    big = m.cmp(">", mant, m.c(SQRT2))
    mant = m.select(big, b.fmul(mant, m.c(0.5)), mant)
    e = b.add(e, b.zext(big, m.ity))
    ef = b.fsub(b.sitofp(e, m.ty), m.select(tiny, m.c(23.0), m.c(0.0)))
    f = b.fsub(mant, m.c(1.0))
    z = b.fmul(f, f)
    y = b.fmul(m.poly(f, LOG_Q), b.fmul(f, z))
    y = m.mad(ef, m.c(LN2_LO), y)
    y = m.mad(z, m.c(-0.5), y)
    r = m.mad(ef, m.c(LN2_HI), b.fadd(f, y))
    r = m.select(m.cmp("==", x, m.c(float("inf"))), x, r)
    r = m.select(m.cmp("==", x, m.c(0.0)), m.c(float("-inf")), r)
    negative_or_nan = b.fcmp_unordered("<", x, m.c(0.0))
    return m.select(negative_or_nan, m.c(float("nan")), r)
