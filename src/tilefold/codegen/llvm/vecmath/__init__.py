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

from tilefold.codegen.llvm.vecmath.builder import MathBuilder, concat_lanes, split_lanes
from tilefold.codegen.llvm.vecmath.erf import erf, gelu
from tilefold.codegen.llvm.vecmath.exp_log import exp, exp_nonpositive, log
from tilefold.codegen.llvm.vecmath.logistic import gelu_tanh, sigmoid, silu, tanh

Emitter = Callable[[MathBuilder, ir.Value], ir.Value]


def _rsqrt(m: MathBuilder, x: ir.Value) -> ir.Value:
    """1/sqrt(x) from the correctly rounded sqrt and division (no approximate instruction)."""
    return m.b.fdiv(m.c(1.0), m.sqrt(x))


MATH_FUNCTIONS: dict[str, Emitter] = {
    "exp": exp,
    "exp_nonpositive": exp_nonpositive,
    "log": log,
    "tanh": tanh,
    "erf": erf,
    "sigmoid": sigmoid,
    "silu": silu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "rsqrt": _rsqrt,
}

# Functions defined on part of the line only (callers guarantee the domain): exp_nonpositive
# on x <= 0, where it gives 0 for a subnormal e**x (an absolute error under 2**-126).
RESTRICTED = frozenset({"exp_nonpositive"})

# Max error in ULPs of the f32 result (distance to the exact value, ulp of the exact value).
ULP_BOUNDS: dict[str, float] = {
    "exp": 1.0,
    "exp_nonpositive": 1.0,  # where e**x is normal; on x <= 0 only (see RESTRICTED)
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


# Registers' worth of lanes a math function is evaluated on at once: two independent
# dependency chains, interleaved operation by operation. A function's chain is long (gelu's
# runs about 50 dependent operations) and one vector's worth leaves the FP pipes idle behind
# its latencies; three or more spill on 16 registers. Zen 1, 1 thread: gelu 1.3x (the
# elementwise kernel) and 1.5x (the GEMM epilogue), sigmoid 1.15x, exp and tanh 1.05x.
MATH_VECTORS = 2


def emit_math_parts(b: ir.IRBuilder, name: str, parts: tuple[ir.Value, ...],
                    features: frozenset[str] = frozenset()) -> tuple[ir.Value, ...]:
    """`name` of each of the equal vectors `parts`, evaluated `MATH_VECTORS` at a time as one
    vector that many times as wide: LLVM splits each of its operations into adjacent
    register-wide pieces, so the chains overlap."""
    out: list[ir.Value] = []
    for start in range(0, len(parts), MATH_VECTORS):
        group = list(parts[start:start + MATH_VECTORS])
        wide = emit_math(b, name, concat_lanes(b, group), features)
        out.extend(split_lanes(b, wide, group[0].type.count))
    return tuple(out)


__all__ = ["MATH_FUNCTIONS", "MATH_VECTORS", "RESTRICTED", "ULP_BOUNDS", "MathBuilder", "emit_math",
           "emit_math_parts"]
