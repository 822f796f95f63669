"""Elementwise ops: unary math, binary arithmetic and comparisons with broadcasting, where, cast."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.ops.common import evaluate, int_range, require, round_to, same_dtype, widen
from tilefold.ir.shapes import broadcast_shapes
from tilefold.ir.types import TensorType

erf = np.vectorize(math.erf, otypes=[np.float64])


class Unary(OpDef):
    """Base of `%y = NAME(%x) : T`: same shape and dtype in and out."""

    operands = ("x",)
    traits = frozenset({"pure", "elementwise", "lowered"})
    accepts = "float"  # operand kinds, see common._ACCEPTS

    @staticmethod
    def fn(x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        require(cls.name, x, cls.accepts)
        return [x.without_layout()]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return evaluate(lambda x: cls.fn(x, **attrs), args, dtypes.dtype(args[0].dtype))


def unary(
    name: str, fn: Callable[..., np.ndarray], doc: str, accepts: str = "float", **specs: Attr
) -> type[OpDef]:
    """Declare and register a unary elementwise op in one line."""
    cls = type(
        name.title().replace("_", ""),
        (Unary,),
        {
            "name": name,
            "fn": staticmethod(fn),
            "accepts": accepts,
            "attributes": attr_table(**specs),
            "__doc__": doc,
        },
    )
    return register(cls)


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _softplus(x, beta=1.0, threshold=20.0):
    z = x * beta
    return np.where(z > threshold, x, np.logaddexp(0.0, z) / beta)


unary("neg", np.negative, "-x; integers wrap", accepts="numeric")
unary("abs", np.abs, "|x|; abs of the most negative integer wraps to itself", accepts="numeric")
unary("exp", np.exp, "e**x")
unary("log", np.log, "natural logarithm; log(0) = -inf, log(x<0) = nan")
unary("sqrt", np.sqrt, "square root; nan for x < 0")
unary("rsqrt", lambda x: 1 / np.sqrt(x), "1/sqrt(x); inf at 0")
unary("reciprocal", lambda x: 1 / x, "1/x")
unary("tanh", np.tanh, "hyperbolic tangent")
unary("erf", erf, "the error function")
unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)), "1/(1+e**-x)")
unary("relu", lambda x: np.maximum(x, 0), "max(x, 0); NaN stays NaN", accepts="numeric")
unary("silu", lambda x: x / (1 + np.exp(-x)), "x*sigmoid(x)")
unary("sin", np.sin, "sine")
unary("cos", np.cos, "cosine")
unary("floor", np.floor, "round toward -inf")
unary(
    "softplus",
    _softplus,
    "log(1 + e**(beta*x)) / beta, and x where beta*x > threshold (as torch.nn.functional)",
    beta=Attr("float", 1.0),
    threshold=Attr("float", 20.0),
)
unary(
    "gelu",
    _gelu,
    'x*Phi(x) (`approximate = "none"`, with erf) or its tanh approximation',
    approximate=Attr("str", "none", choices=("none", "tanh")),
)


class Binary(OpDef):
    """Base of `%z = NAME(%x, %y) : T`: NumPy broadcasting, both operands of one dtype."""

    operands = ("x", "y")
    traits = frozenset({"pure", "elementwise", "lowered"})
    accepts = "numeric"  # operand kinds, see common._ACCEPTS
    result_dtype: dtypes.DType | None = None  # None: the operands' dtype

    @staticmethod
    def fn(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        dt = same_dtype(cls.name, types)
        require(cls.name, types[0], cls.accepts)
        shape = broadcast_shapes(cls.name, *(t.shape for t in types))
        return [TensorType(shape, cls.result_dtype or dt)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        out = cls.result_dtype or dtypes.dtype(args[0].dtype)
        return evaluate(cls.fn, args, out)


def binary(
    name: str,
    fn: Callable[..., np.ndarray],
    doc: str,
    traits: Iterable[str] = (),
    accepts: str = "numeric",
    result_dtype: dtypes.DType | None = None,
) -> type[OpDef]:
    """Declare and register a binary elementwise op in one line."""
    cls = type(
        name.title().replace("_", ""),
        (Binary,),
        {
            "name": name,
            "fn": staticmethod(fn),
            "traits": Binary.traits | set(traits),
            "accepts": accepts,
            "result_dtype": result_dtype,
            "__doc__": doc,
        },
    )
    return register(cls)


def _divide(x, y):
    if x.dtype.kind != "i":
        return x / y
    # C-style division truncating toward zero (floor division corrected); x / 0 gives 0.
    safe = np.where(y == 0, 1, y)
    q = x // safe
    q = q + ((x % safe != 0) & ((x < 0) != (safe < 0)))
    return np.where(y == 0, 0, q)


def _power(x, y):
    if x.dtype.kind != "i":
        return np.power(x, y)
    # An integer to a negative power truncates 1 / x**-y: 0 unless |x| = 1 (and 0 for x = 0).
    negative = y < 0
    inverse = np.where(x == 1, 1, np.where(x == -1, 1 - 2 * (y % 2), 0))
    return np.where(negative, inverse, np.power(x, np.where(negative, 0, y)))


binary("add", np.add, "x + y", traits={"commutative"})
binary("sub", np.subtract, "x - y")
binary("mul", np.multiply, "x * y", traits={"commutative"})
binary("div", _divide, "x / y; integers truncate toward zero and x / 0 is 0")
binary("max", np.maximum, "elementwise maximum; NaN propagates", traits={"commutative"})
binary("min", np.minimum, "elementwise minimum; NaN propagates", traits={"commutative"})
binary("pow", _power, "x ** y; for integers a negative y truncates (0 unless |x| = 1)")
_COMPARE = {"accepts": "any", "result_dtype": dtypes.boolean}
binary("eq", np.equal, "x == y", traits={"commutative"}, **_COMPARE)
binary("ne", np.not_equal, "x != y", traits={"commutative"}, **_COMPARE)
binary("lt", np.less, "x < y", **_COMPARE)
binary("le", np.less_equal, "x <= y", **_COMPARE)
binary("gt", np.greater, "x > y", **_COMPARE)
binary("ge", np.greater_equal, "x >= y", **_COMPARE)
binary("and", np.logical_and, "logical and of bools", traits={"commutative"}, accepts="bool")
binary("or", np.logical_or, "logical or of bools", traits={"commutative"}, accepts="bool")


@register
class Where(OpDef):
    """`cond ? x : y` elementwise, all three broadcast. `%z = where(%c, %x, %y) : f32[4]`"""

    name = "where"
    operands = ("cond", "x", "y")
    traits = frozenset({"pure", "elementwise", "lowered"})

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        cond, x, y = types
        if cond.dtype != dtypes.boolean:
            raise DTypeError(f"where: condition must be bool, got {cond}; compare first")
        dt = same_dtype("where", [x, y])
        return [TensorType(broadcast_shapes("where", cond.shape, x.shape, y.shape), dt)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return evaluate(np.where, args, dtypes.dtype(args[1].dtype))


@register
class Cast(OpDef):
    """Convert to `dtype`, as PyTorch's `.to()` but saturating.

    To a float: round to nearest even, once (fp8e4m3 turns out-of-range values into NaN, fp4e2m1
    saturates, as ml_dtypes does). Float to integer: truncate toward zero, saturate at the
    integer's range, NaN -> 0. Integer to integer: wrap. To bool: x != 0.
    `%y = cast(%x) {dtype = bf16} : bf16[4]`
    """

    name = "cast"
    operands = ("x",)
    attributes = attr_table(dtype=Attr("dtype"))
    traits = frozenset({"pure", "elementwise", "lowered"})

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        return [TensorType(types[0].shape, attrs["dtype"])]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        (x,) = args
        source, target = dtypes.dtype(x.dtype), attrs["dtype"]
        if target.is_float and source.kind != "bool":
            return round_to(widen(x).astype(np.float64), target)
        if source.is_float and target.is_integer:
            lo, hi = int_range(target)
            with np.errstate(all="ignore"):
                w = widen(x)
                t = np.trunc(np.where(np.isnan(w), 0.0, w))
                x = np.where(t >= float(hi), hi, np.where(t <= lo, lo, t.astype(np.int64)))
        return np.asarray(x).astype(target.np_dtype)
