"""Vectorized f32 math in LLVM IR: one emitter per function, for scalars and any vector width.

Each emitter takes a `MathBuilder` (IR builder + value type) and an f32 value and returns the
result value. `ULP_BOUNDS` is the documented worst error against the exact result, measured over
every exponent (both signs, ±0, subnormals, ±inf, NaN) plus random samples by
tests/codegen_kernel/test_vecmath_ulp.py; special values (inf, NaN) match the reference
interpreter exactly. The bounds hold on targets with FMA; without it the exact products degrade.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tilefold.codegen.vecmath.builder import MathBuilder
from tilefold.codegen.vecmath.erf import erf, gelu
from tilefold.codegen.vecmath.exp_log import exp, log
from tilefold.codegen.vecmath.logistic import gelu_tanh, sigmoid, silu, tanh

Emitter = Callable[[MathBuilder, ir.Value], ir.Value]


def _rsqrt(m: MathBuilder, x: ir.Value) -> ir.Value:
    """1/sqrt(x) from the correctly rounded sqrt and division (no approximate instruction)."""
    return m.b.fdiv(m.c(1.0), m.sqrt(x))


MATH_FUNCTIONS: dict[str, Emitter] = {
    "exp": exp,
    "log": log,
    "tanh": tanh,
    "erf": erf,
    "sigmoid": sigmoid,
    "silu": silu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "rsqrt": _rsqrt,
}

# Max error in ULPs of the f32 result (distance to the exact value, ulp of the exact value).
ULP_BOUNDS: dict[str, float] = {
    "exp": 1.0,
    "log": 1.0,
    "tanh": 1.5,
    "erf": 2.5,
    "sigmoid": 2.5,
    "silu": 3.0,
    "gelu": 5.0,
    "gelu_tanh": 3.0,
    "rsqrt": 1.5,
}


def emit_math(
    b: ir.IRBuilder, name: str, x: ir.Value, features: frozenset[str] = frozenset()
) -> ir.Value:
    """`name`(x) for an f32 scalar or vector `x`, emitted inline at `b`; `features` (the
    target's) enable ISA-specific forms with the same results, e.g. AVX-512's vscalefps."""
    return MATH_FUNCTIONS[name](MathBuilder(b, x.type, features), x)


__all__ = ["MATH_FUNCTIONS", "ULP_BOUNDS", "MathBuilder", "emit_math"]
