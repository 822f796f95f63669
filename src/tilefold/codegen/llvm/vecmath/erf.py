"""erf and the erf form of GELU; erfc is computed directly so negative tails keep precision."""

from __future__ import annotations

import math

from llvmlite import ir

from tilefold.codegen.llvm.vecmath.builder import MathBuilder, split
from tilefold.codegen.llvm.vecmath.exp_log import exp_parts, exp_scalef

SMALL = 0.5  # erf: below, erf(a) = a * P(a**2); above, erf(a) = 1 - erfc(a)
# erf(a) = a * (C0 + s * P(s)), s = a**2 <= 0.25, C0 = 2/sqrt(pi) kept as hi + lo (its f32
# rounding alone would cost 0.9 ulp); P by weighted least squares, rel. error 4.7e-9.
ERF_C0_HI, ERF_C0_LO = split(2 / math.sqrt(math.pi))
ERF_P = (-0.37612637877464294, 0.11283770948648453, -0.026861926540732384,
         0.005191535223275423, -0.0007509536808356643)
# erfc(a) = t * exp(-a**2 + Q(t - T_CENTER)), t = 1/(1 + a/2), for 0 <= a <= A_MAX: Q is
# log(erfc(a) * exp(a**2) / t), near-minimax with f32 coefficients, abs. error 1.5e-8.
ERFC_Q = (-0.5357597470283508, 1.37142014503479, 0.07027456164360046, -0.4089020788669586,
          -0.010260213166475296, 0.28868603706359863, -0.08103591948747635, -0.2258131504058838,
          0.16608478128910065, 0.12413176149129868, -0.1475081443786621)
T_CENTER = 0.6
A_MAX = 10.75  # x * erfc(|x|/sqrt2) / 2 is below half the smallest subnormal beyond
RSQRT2_HI, RSQRT2_LO = split(1 / math.sqrt(2))


def _erf_small(m: MathBuilder, a: ir.Value) -> ir.Value:
    s = m.b.fmul(a, a)
    rest = m.mad(s, m.poly(s, ERF_P), m.c(ERF_C0_LO))
    return m.fma(a, m.c(ERF_C0_HI), m.b.fmul(a, rest))


def erfc_times(m: MathBuilder, a_hi: ir.Value, a_lo: ir.Value | None = None,
               factor: ir.Value | None = None) -> ir.Value:
    """erfc(a) * factor for 0 <= a <= A_MAX, rounded once at the end (subnormal results too).

    a = a_hi + a_lo; -a**2 is carried as an exact hi + lo pair, since its rounding error
    (up to 2**-24 * a**2) would otherwise be amplified into a relative error of erfc.
    """
    b = m.b
    t = b.fdiv(m.c(1.0), m.mad(a_hi, m.c(0.5), m.c(1.0)))
    q = m.poly(b.fsub(t, m.c(T_CENTER)), ERFC_Q)
    sq_hi, sq_lo = m.two_prod(a_hi, a_hi)
    if a_lo is not None:
        sq_lo = m.mad(b.fmul(a_hi, m.c(2.0)), a_lo, sq_lo)
    hi, lo = m.two_sum(b.fneg(sq_hi), q)
    lo = b.fsub(lo, sq_lo)
    if m.scalef:
        mantissa, n = exp_scalef(m, hi, lo)
    else:
        mantissa, scale = exp_parts(m, hi, lo)
    mantissa = b.fmul(mantissa, t)
    if factor is not None:
        mantissa = b.fmul(mantissa, factor)
    return m.scale(mantissa, n) if m.scalef else b.fmul(mantissa, scale)


def erf(m: MathBuilder, x: ir.Value) -> ir.Value:
    b = m.b
    a = m.abs(x)
    big = b.fsub(m.c(1.0), erfc_times(m, m.clamp(a, SMALL, A_MAX)))
    small = _erf_small(m, a)
    return m.copysign(m.select(m.cmp("<", a, m.c(SMALL)), small, big), x)


def gelu(m: MathBuilder, x: ir.Value) -> ir.Value:
    """x * Phi(x) = x - g for x >= 0 and g for x < 0, g = x/2 * erfc(|x|/sqrt2): neither side
    cancels, and the left tail is scaled by x/2 before its one rounding, so subnormal results
    are still accurate."""
    b = m.b
    ax = m.abs(x)
    beyond = m.cmp(">", ax, m.c(A_MAX * math.sqrt(2)))  # g is below 2**-150 there
    ax = m.select(beyond, m.c(A_MAX * math.sqrt(2)), ax)
    a_hi = b.fmul(ax, m.c(RSQRT2_HI))
    a_lo = m.mad(ax, m.c(RSQRT2_LO), m.fma(ax, m.c(RSQRT2_HI), b.fneg(a_hi)))
    g = erfc_times(m, a_hi, a_lo, b.fmul(x, m.c(0.5)))
    g = m.select(beyond, m.c(-0.0), g)
    y = m.select(m.cmp("<", x, m.c(0.0)), g, b.fsub(x, g))
    return m.select(m.cmp("==", x, m.c(float("-inf"))), m.c(float("nan")), y)
