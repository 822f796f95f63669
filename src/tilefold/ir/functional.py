"""NumPy-like functions over builder Tensors: `F.gelu(x)`, `F.softmax(s, axis=-1)`, ...

Each is a thin call of `Builder.op`; the op's declaration (tilefold.ir.ops) defines its meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from tilefold import dtypes
from tilefold.ir.builder import Tensor


def _unary(name: str):
    def fn(x: Tensor, **attrs) -> Tensor:
        return x.builder.op(name, x, **attrs)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise `{name}` (see the op declaration for its exact meaning)."
    return fn


def _binary(name: str):
    def fn(x, y) -> Tensor:
        builder = x.builder if isinstance(x, Tensor) else y.builder
        a, b = builder.promote(x, y)
        return builder.op(name, a, b)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise `{name}` with broadcasting and dtype promotion."
    return fn


def _reduction(name: str):
    def fn(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        axes = None if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
        return x.builder.op(name, x, axes=axes, keepdims=keepdims)

    fn.__name__ = name
    fn.__doc__ = f"`{name}` over `axis` (all axes when None)."
    return fn


neg, abs, exp, log, sqrt, rsqrt, reciprocal = map(
    _unary, ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal"]
)
tanh, erf, sigmoid, relu, silu, sin, cos, floor = map(
    _unary, ["tanh", "erf", "sigmoid", "relu", "silu", "sin", "cos", "floor"]
)
add, sub, mul, div, maximum, minimum, power = map(
    _binary, ["add", "sub", "mul", "div", "max", "min", "pow"]
)
equal, not_equal, less, less_equal, greater, greater_equal = map(
    _binary, ["eq", "ne", "lt", "le", "gt", "ge"]
)
logical_and, logical_or = map(_binary, ["and", "or"])
sum, max, min, mean = map(_reduction, ["reduce_sum", "reduce_max", "reduce_min", "reduce_mean"])


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return x.builder.op("gelu", x, approximate=approximate)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    return x.builder.op("softmax", x, axis=axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    return x.builder.op("log_softmax", x, axis=axis)


def layer_norm(
    x: Tensor,
    weight: Tensor | ArrayLike,
    bias: Tensor | ArrayLike,
    eps: float = 1e-5,
    axis: int = -1,
) -> Tensor:
    b = x.builder
    return b.op("layer_norm", x, b.tensor(weight), b.tensor(bias), eps=eps, axis=axis)


def rms_norm(x: Tensor, weight: Tensor | ArrayLike, eps: float = 1e-6, axis: int = -1) -> Tensor:
    return x.builder.op("rms_norm", x, x.builder.tensor(weight), eps=eps, axis=axis)


def matmul(
    a: Tensor, b: Tensor | ArrayLike, transpose_a: bool = False, transpose_b: bool = False
) -> Tensor:
    a, b = a.builder.promote(a, b)
    return a.builder.op("matmul", a, b, transpose_a=transpose_a, transpose_b=transpose_b)


def where(cond: Tensor, x: Tensor | ArrayLike, y: Tensor | ArrayLike) -> Tensor:
    """`x` where `cond` else `y`; `x` and `y` promote like a binary op's operands."""
    x, y = cond.builder.promote(x, y)
    return cond.builder.op("where", cond, x, y)


def cast(x: Tensor, dtype: str | dtypes.DType | np.dtype | type) -> Tensor:
    return x.astype(dtype)


def reshape(x: Tensor, shape: Sequence) -> Tensor:
    return x.reshape(tuple(shape))


def transpose(x: Tensor, perm: Sequence[int] | None = None) -> Tensor:
    perm = tuple(reversed(range(x.ndim))) if perm is None else tuple(perm)
    return x.builder.op("transpose", x, perm=perm)


def concat(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    return xs[0].builder.op("concat", *xs, axis=axis)


def broadcast_to(x: Tensor, shape: Sequence) -> Tensor:
    return x.builder.op("broadcast_to", x, shape=tuple(shape))


def expand_dims(x: Tensor, axes: int | Sequence[int]) -> Tensor:
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    return x.builder.op("expand_dims", x, axes=axes)


def squeeze(x: Tensor, axes: int | Sequence[int]) -> Tensor:
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    return x.builder.op("squeeze", x, axes=axes)


def gather(x: Tensor, indices: Tensor | ArrayLike, axis: int = 0) -> Tensor:
    return x.builder.op("gather", x, x.builder.tensor(indices), axis=axis)


def embedding(table: Tensor, ids: Tensor | ArrayLike) -> Tensor:
    """Rows of `table` picked by integer `ids` (gather on axis 0)."""
    return gather(table, ids, axis=0)
