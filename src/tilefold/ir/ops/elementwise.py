"""Elementwise ops: unary math, binary arithmetic and comparisons with broadcasting, where, cast."""

from __future__ import annotations

import math

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError
from tilefold.ir.opdef import Attr, OpDef, register
from tilefold.ir.ops.common import evaluate, require_float, same_dtype
from tilefold.ir.shapes import broadcast_shapes
from tilefold.ir.types import TensorType

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return _erf(x).astype(x.dtype)


class Unary(OpDef):
    """Base of `%y = NAME(%x) : T`: same shape and dtype in and out."""

    operands = ("x",)
    traits = frozenset({"pure", "elementwise"})
    float_only = True

    @staticmethod
    def fn(x):
        raise NotImplementedError

    @classmethod
    def infer(cls, types, attrs):
        (x,) = types
        if cls.float_only:
            require_float(cls.name, x)
        return [x.without_layout()]

    @classmethod
    def reference(cls, args, attrs):
        return evaluate(lambda x: cls.fn(x, **attrs), args, dtypes.dtype(args[0].dtype))


def unary(name: str, fn, doc: str, float_only: bool = True, **attributes: Attr) -> type[OpDef]:
    """Declare and register a unary elementwise op in one line."""
    cls = type(
        name.title().replace("_", ""),
        (Unary,),
        {
            "name": name,
            "fn": staticmethod(fn),
            "float_only": float_only,
            "attributes": attributes,
            "__doc__": doc,
        },
    )
    return register(cls)


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


unary("neg", np.negative, "-x", float_only=False)
unary("abs", np.abs, "|x|", float_only=False)
unary("exp", np.exp, "e**x")
unary("log", np.log, "natural logarithm; log(0) = -inf, log(x<0) = nan")
unary("sqrt", np.sqrt, "square root; nan for x < 0")
unary("rsqrt", lambda x: 1 / np.sqrt(x), "1/sqrt(x); inf at 0")
unary("reciprocal", lambda x: 1 / x, "1/x")
unary("tanh", np.tanh, "hyperbolic tangent")
unary("erf", erf, "the error function")
unary("sigmoid", lambda x: 1 / (1 + np.exp(-x)), "1/(1+e**-x)")
unary("relu", lambda x: np.maximum(x, 0), "max(x, 0); NaN stays NaN", float_only=False)
unary("silu", lambda x: x / (1 + np.exp(-x)), "x*sigmoid(x)")
unary("sin", np.sin, "sine")
unary("cos", np.cos, "cosine")
unary("floor", np.floor, "round toward -inf")
unary(
    "gelu",
    _gelu,
    "x*Phi(x) (`approximate = \"none\"`, with erf) or its tanh approximation",
    approximate=Attr("str", "none", choices=("none", "tanh")),
)


class Binary(OpDef):
    """Base of `%z = NAME(%x, %y) : T`: NumPy broadcasting, both operands of one dtype."""

    operands = ("x", "y")
    traits = frozenset({"pure", "elementwise"})
    result_dtype: dtypes.DType | None = None  # None: the operands' dtype

    @staticmethod
    def fn(x, y):
        raise NotImplementedError

    @classmethod
    def infer(cls, types, attrs):
        dt = same_dtype(cls.name, types)
        shape = broadcast_shapes(cls.name, *(t.shape for t in types))
        return [TensorType(shape, cls.result_dtype or dt)]

    @classmethod
    def reference(cls, args, attrs):
        out = cls.result_dtype or dtypes.dtype(args[0].dtype)
        return evaluate(cls.fn, args, out)


def binary(name: str, fn, doc: str, traits=(), result_dtype=None) -> type[OpDef]:
    """Declare and register a binary elementwise op in one line."""
    cls = type(
        name.title().replace("_", ""),
        (Binary,),
        {
            "name": name,
            "fn": staticmethod(fn),
            "traits": Binary.traits | set(traits),
            "result_dtype": result_dtype,
            "__doc__": doc,
        },
    )
    return register(cls)


def _divide(x, y):
    if np.issubdtype(x.dtype, np.integer):
        # C-style division, truncating toward zero; x / 0 gives 0.
        q = np.abs(x) // np.where(y == 0, 1, np.abs(y))
        return np.where(y == 0, 0, q * np.sign(x) * np.sign(y))
    return x / y


binary("add", np.add, "x + y", traits={"commutative"})
binary("sub", np.subtract, "x - y")
binary("mul", np.multiply, "x * y", traits={"commutative"})
binary("div", _divide, "x / y; integers truncate toward zero")
binary("max", np.maximum, "elementwise maximum; NaN propagates", traits={"commutative"})
binary("min", np.minimum, "elementwise minimum; NaN propagates", traits={"commutative"})
binary("pow", np.power, "x ** y")
binary("eq", np.equal, "x == y", traits={"commutative"}, result_dtype=dtypes.boolean)
binary("ne", np.not_equal, "x != y", traits={"commutative"}, result_dtype=dtypes.boolean)
binary("lt", np.less, "x < y", result_dtype=dtypes.boolean)
binary("le", np.less_equal, "x <= y", result_dtype=dtypes.boolean)
binary("gt", np.greater, "x > y", result_dtype=dtypes.boolean)
binary("ge", np.greater_equal, "x >= y", result_dtype=dtypes.boolean)
binary("and", np.logical_and, "logical and of bools", traits={"commutative"})
binary("or", np.logical_or, "logical or of bools", traits={"commutative"})


@register
class Where(OpDef):
    """`cond ? x : y` elementwise, all three broadcast. `%z = where(%c, %x, %y) : f32[4]`"""

    name = "where"
    operands = ("cond", "x", "y")
    traits = frozenset({"pure", "elementwise"})

    @classmethod
    def infer(cls, types, attrs):
        cond, x, y = types
        if cond.dtype != dtypes.boolean:
            raise DTypeError(f"where: condition must be bool, got {cond}; compare first")
        dt = same_dtype("where", [x, y])
        return [TensorType(broadcast_shapes("where", cond.shape, x.shape, y.shape), dt)]

    @classmethod
    def reference(cls, args, attrs):
        return evaluate(np.where, args, dtypes.dtype(args[1].dtype))


@register
class Cast(OpDef):
    """Convert to `dtype`: floats round to nearest even; float->int truncates and saturates
    (NaN -> 0).

    `%y = cast(%x) {dtype = bf16} : bf16[4]`
    """

    name = "cast"
    operands = ("x",)
    attributes = {"dtype": Attr("dtype")}
    traits = frozenset({"pure", "elementwise"})

    @classmethod
    def infer(cls, types, attrs):
        return [TensorType(types[0].shape, attrs["dtype"])]

    @classmethod
    def reference(cls, args, attrs):
        (x,) = args
        target: dtypes.DType = attrs["dtype"]
        if dtypes.dtype(x.dtype).is_float and target.is_integer:
            with np.errstate(all="ignore"):
                x = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
                info = np.iinfo(target.np_dtype) if target.bits >= 8 else None
                if info is not None:
                    x = np.clip(x, info.min, info.max)
        return np.asarray(x).astype(target.np_dtype)
