"""`MathBuilder`: f32 math in LLVM IR that reads the same for scalars and any vector width."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from tilefold.codegen.llvm.util import intrinsic

F32 = ir.FloatType()
I32 = ir.IntType(32)


def f32(value: float) -> float:
    """`value` rounded to the nearest f32, for constants that must be exact in the IR."""
    return float(np.float32(value))


def split(value: float) -> tuple[float, float]:
    """`value` as hi + lo, both f32: hi is the nearest f32, lo the rest (for extra precision)."""
    hi = f32(value)
    return hi, f32(value - hi)


class MathBuilder:
    """Emits f32 math on values of one type: `float` or `<N x float>`.

    Polynomials use `llvm.fmuladd` (fused where the target has FMA, else mul + add); `fma`
    is the exact fused form used for error-free products, which needs FMA hardware to be fast.
    """

    def __init__(self, b: ir.IRBuilder, ty: ir.Type, features: frozenset[str] = frozenset()):
        self.b = b
        self.ty = ty
        lanes = ty.count if isinstance(ty, ir.VectorType) else None
        # AVX-512's vscalefps: x * 2**n in one instruction, rounding subnormals once; wider
        # vectors (`MATH_VECTORS` registers evaluated as one) take one per 16 lanes.
        self.scalef = (lanes is not None and lanes % 16 == 0 and "avx512f" in features) or \
            (lanes in (4, 8) and {"avx512f", "avx512vl"} <= features)
        self.ity = I32 if lanes is None else ir.VectorType(I32, lanes)
        self._suffix = "f32" if lanes is None else f"v{lanes}f32"

    def c(self, value: float) -> ir.Constant:
        if isinstance(self.ty, ir.VectorType):
            return ir.Constant(self.ty, [f32(value)] * self.ty.count)
        return ir.Constant(self.ty, f32(value))

    def ic(self, value: int) -> ir.Constant:
        if isinstance(self.ity, ir.VectorType):
            return ir.Constant(self.ity, [value] * self.ity.count)
        return ir.Constant(self.ity, value)

    def _call(self, name: str, *args: ir.Value) -> ir.Value:
        fn = intrinsic(self.b.module, f"llvm.{name}.{self._suffix}", self.ty, [self.ty] * len(args))
        return self.b.call(fn, list(args))

    def mad(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        """x*y + z, fused when the target can."""
        return self._call("fmuladd", x, y, z)

    def fma(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        """x*y + z with one rounding (exact error terms need this)."""
        return self._call("fma", x, y, z)

    def poly(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """c0 + c1*x + ... + cn*x**n by Horner's rule; `coeffs` low order first."""
        acc = self.c(coeffs[-1])
        for coeff in reversed(coeffs[:-1]):
            acc = self.mad(acc, x, self.c(coeff))
        return acc

    def abs(self, x: ir.Value) -> ir.Value:
        return self._call("fabs", x)

    def copysign(self, magnitude: ir.Value, sign: ir.Value) -> ir.Value:
        return self._call("copysign", magnitude, sign)

    def sqrt(self, x: ir.Value) -> ir.Value:
        return self._call("sqrt", x)

    def cmp(self, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
        """Ordered comparison (false when either side is NaN); "uno" tests for NaN."""
        if op == "uno":
            return self.b.fcmp_unordered("uno", x, y)
        return self.b.fcmp_ordered(op, x, y)

    def select(self, cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.select(cond, x, y)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """x limited to [lo, hi]; NaN stays NaN."""
        x = self.select(self.cmp("<", x, self.c(lo)), self.c(lo), x)
        return self.select(self.cmp(">", x, self.c(hi)), self.c(hi), x)

    def scale(self, x: ir.Value, n: ir.Value) -> ir.Value:
        """x * 2**n for integral float n (only when `self.scalef`)."""
        lanes = self.ty.count
        if lanes > 16:  # one vscalefps per 512-bit piece
            return concat_lanes(self.b, [self._scalef(p, q) for p, q in zip(
                split_lanes(self.b, x, 16), split_lanes(self.b, n, 16), strict=True)])
        return self._scalef(x, n)

    def _scalef(self, x: ir.Value, n: ir.Value) -> ir.Value:
        ty = x.type
        lanes = ty.count
        mask = ir.IntType(max(lanes, 8))
        args = [ty, ty, ty, mask] + ([I32] if lanes == 16 else [])
        fn = intrinsic(self.b.module, f"llvm.x86.avx512.mask.scalef.ps.{32 * lanes}", ty, args)
        extra = [ir.Constant(I32, 4)] if lanes == 16 else []  # 4: current rounding mode
        return self.b.call(fn, [x, n, x, ir.Constant(mask, -1), *extra])

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.ity)

    def floats(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, self.ty)

    def two_prod(self, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
        """x*y exactly, as hi + lo."""
        hi = self.b.fmul(x, y)
        return hi, self.fma(x, y, self.b.fneg(hi))

    def two_sum(self, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
        """x+y exactly, as hi + lo (Knuth's branch-free TwoSum)."""
        b = self.b
        hi = b.fadd(x, y)
        yy = b.fsub(hi, x)
        lo = b.fadd(b.fsub(x, b.fsub(hi, yy)), b.fsub(y, yy))
        return hi, lo


def split_lanes(b: ir.IRBuilder, x: ir.Value, lanes: int) -> list[ir.Value]:
    """Vector `x` as consecutive `lanes`-wide pieces (itself when it is that wide)."""
    count = x.type.count
    if count == lanes:
        return [x]
    return [b.shuffle_vector(x, x, _lane_indices(first, lanes))
            for first in range(0, count, lanes)]


def concat_lanes(b: ir.IRBuilder, pieces: list[ir.Value]) -> ir.Value:
    """The equal vectors `pieces` (a power-of-two count) as one vector, in order."""
    while len(pieces) > 1:
        pieces = [b.shuffle_vector(x, y, _lane_indices(0, 2 * x.type.count))
                  for x, y in zip(pieces[0::2], pieces[1::2], strict=True)]
    return pieces[0]


def _lane_indices(first: int, count: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, count), list(range(first, first + count)))
