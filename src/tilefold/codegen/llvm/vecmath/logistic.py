"""The logistic family for f32: sigmoid, silu, tanh and the tanh form of GELU."""

from __future__ import annotations

import math

from llvmlite import ir

from tilefold.codegen.llvm.vecmath.builder import MathBuilder, split
from tilefold.codegen.llvm.vecmath.exp_log import exp, exp_parts

# tanh(a) = a + a**3 * P(a**2) for a < 0.625 (Cephes tanhf).
TANH_P = (-3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2, 2.06390887954e-2,
          -5.70498872745e-3)
TANH_SMALL = 0.625
GELU_K_HI, GELU_K_LO = split(2 * math.sqrt(2 / math.pi))  # v = K x (1 + C x**2) = 2u
GELU_C_HI, GELU_C_LO = split(0.044715)
GELU_X_MAX = 20.0  # |v| > 600 beyond: sigmoid(v) is exactly 0 or 1 in f32


def scaled_sigmoid(
    m: MathBuilder, x: ir.Value, v_hi: ir.Value, v_lo: ir.Value | None = None
) -> ir.Value:
    """x * sigmoid(v) for v = v_hi + v_lo.

    With e = exp(-|v|): v >= 0 gives x / (1 + e); v < 0 gives x * e / (1 + e), where x/(1+e)
    is folded into e's mantissa before the last scaling so that subnormal results round once.
    """
    b = m.b
    negative = m.cmp("<", v_hi, m.c(0.0))
    w_lo = None if v_lo is None else m.select(negative, v_lo, b.fneg(v_lo))
    mantissa, scale = exp_parts(m, b.fneg(m.abs(v_hi)), w_lo)
    xr = b.fdiv(x, b.fadd(m.c(1.0), b.fmul(mantissa, scale)))
    return m.select(negative, b.fmul(b.fmul(mantissa, xr), scale), xr)


def _nan_at_minus_inf(m: MathBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """The reference's x/(1 + e**-x) is -inf/inf = NaN at x = -inf; match it."""
    return m.select(m.cmp("==", x, m.c(float("-inf"))), m.c(float("nan")), y)


def sigmoid(m: MathBuilder, x: ir.Value) -> ir.Value:
    return scaled_sigmoid(m, m.c(1.0), x)


def silu(m: MathBuilder, x: ir.Value) -> ir.Value:
    return _nan_at_minus_inf(m, x, scaled_sigmoid(m, x, x))


def gelu_tanh(m: MathBuilder, x: ir.Value) -> ir.Value:
    """x * (1 + tanh(u)) / 2 = x * sigmoid(2u); 2u is formed in double-f32 arithmetic since
    e**(2u) amplifies its rounding error by |2u| (up to 87 before underflow)."""
    b = m.b
    xc = m.clamp(x, -GELU_X_MAX, GELU_X_MAX)
    s_hi, s_lo = m.two_prod(xc, xc)
    w_hi = m.mad(m.c(GELU_C_HI), s_hi, m.c(1.0))
    w_lo = m.fma(m.c(GELU_C_HI), s_hi, b.fsub(m.c(1.0), w_hi))
    w_lo = m.mad(m.c(GELU_C_HI), s_lo, m.mad(m.c(GELU_C_LO), s_hi, w_lo))
    p_hi, p_lo = m.two_prod(m.c(GELU_K_HI), xc)
    p_lo = m.mad(m.c(GELU_K_LO), xc, p_lo)
    v_hi, v_lo = m.two_prod(p_hi, w_hi)
    v_lo = m.mad(p_hi, w_lo, m.mad(p_lo, w_hi, v_lo))
    return _nan_at_minus_inf(m, x, scaled_sigmoid(m, x, v_hi, v_lo))


def tanh(m: MathBuilder, x: ir.Value) -> ir.Value:
    b = m.b
    a = m.abs(x)
    small = m.mad(b.fmul(m.poly(b.fmul(a, a), TANH_P), b.fmul(a, a)), a, a)
    big = b.fsub(m.c(1.0), b.fdiv(m.c(2.0), b.fadd(exp(m, b.fmul(a, m.c(2.0))), m.c(1.0))))
    return m.copysign(m.select(m.cmp("<", a, m.c(TANH_SMALL)), small, big), x)

