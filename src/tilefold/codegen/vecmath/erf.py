"""erf and the erf form of GELU; erfc is computed directly so negative tails keep precision."""

from __future__ import annotations

import math

from llvmlite import ir

from tilefold.codegen.vecmath.builder import MathBuilder, split
from tilefold.codegen.vecmath.exp_log import exp_parts

SMALL = 0.5  # below: erf(a) = a * P(a**2); above: erfc(a) = t * exp(-a**2 + Q(t - T_CENTER))
# erf(a) = a * (C0 + s * P(s)), s = a**2 <= 0.25, C0 = 2/sqrt(pi) kept as hi + lo (its f32
# rounding alone would cost 0.9 ulp); P by weighted least squares, rel. error 4.7e-9.
ERF_C0_HI, ERF_C0_LO = split(2 / math.sqrt(math.pi))
ERF_P = (-0.37612637877464294, 0.11283770948648453, -0.026861926540732384,
         0.005191535223275423, -0.0007509536808356643)
# log(erfc(a) * exp(a**2) / t), t = 1/(1 + a/2), a in [0.5, 11]; abs. error 1.4e-9 in f64.
ERFC_Q = (-0.6986210942268372, 1.3372665643692017, 0.21148188412189484, -0.3614104986190796,
          -0.18546010553836823, 0.265974760055542, 0.15449300408363342, -0.2796403169631958,
          -0.10882645100355148, 0.2563885450363159, 0.04760850965976715)
T_CENTER = 0.48
A_MAX = 10.75  # x * erfc(|x|/sqrt2) / 2 is below half the smallest subnormal beyond
RSQRT2_HI, RSQRT2_LO = split(1 / math.sqrt(2))


def _erf_small(m: MathBuilder, a: ir.Value) -> ir.Value:
    s = m.b.fmul(a, a)
    rest = m.mad(s, m.poly(s, ERF_P), m.c(ERF_C0_LO))
    return m.fma(a, m.c(ERF_C0_HI), m.b.fmul(a, rest))


def erfc_parts(
    m: MathBuilder, a_hi: ir.Value, a_lo: ir.Value | None = None
) -> tuple[ir.Value, ir.Value]:
    """erfc(a) for SMALL <= a <= A_MAX as (mantissa, scale) like `exp_parts` (t folded in).

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
    mantissa, scale = exp_parts(m, hi, b.fsub(lo, sq_lo))
    return b.fmul(mantissa, t), scale


def erf(m: MathBuilder, x: ir.Value) -> ir.Value:
    b = m.b
    a = m.abs(x)
    mantissa, scale = erfc_parts(m, m.clamp(a, SMALL, A_MAX))
    big = b.fsub(m.c(1.0), b.fmul(mantissa, scale))
    small = _erf_small(m, a)
    return m.copysign(m.select(m.cmp("<", a, m.c(SMALL)), small, big), x)


def gelu(m: MathBuilder, x: ir.Value) -> ir.Value:
    """x * Phi(x), Phi(x) = erfc(-x/sqrt2)/2; for x < -sqrt2/2 the tail e**(-x**2/2) is
    scaled by x/2 before its last rounding, so subnormal results are still accurate."""
    b = m.b
    beyond = m.cmp(">", m.abs(x), m.c(A_MAX * math.sqrt(2)))
    ax = m.clamp(m.abs(x), 0.0, A_MAX * math.sqrt(2))
    a_hi = b.fmul(ax, m.c(RSQRT2_HI))
    a_lo = m.mad(ax, m.c(RSQRT2_LO), m.fma(ax, m.c(RSQRT2_HI), b.fneg(a_hi)))
    negative = m.cmp("<", x, m.c(0.0))
    half_erf = b.fmul(m.copysign(_erf_small(m, a_hi), x), m.c(0.5))
    small = b.fmul(x, b.fadd(m.c(0.5), half_erf))
    mantissa, scale = erfc_parts(m, m.clamp(a_hi, SMALL, A_MAX), a_lo)
    right = b.fmul(x, m.mad(b.fmul(mantissa, scale), m.c(-0.5), m.c(1.0)))
    left = b.fmul(b.fmul(mantissa, b.fmul(x, m.c(0.5))), scale)
    left = m.select(beyond, m.c(-0.0), left)  # the tail is below 2**-150 there
    y = m.select(m.cmp("<", a_hi, m.c(SMALL)), small, m.select(negative, left, right))
    return m.select(m.cmp("==", x, m.c(float("-inf"))), m.c(float("nan")), y)
