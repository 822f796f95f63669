"""Index-producing and index-consuming ops: `arange` (iota) and NumPy-style advanced `index`."""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.shapes import broadcast_shapes, normalize_axes
from tilefold.ir.types import TensorType


@register
class Arange(OpDef):
    """start + step * i for i in [0, n): `shape = [n]` holds the one (possibly symbolic) length.

    `%i = arange() {shape = [?s], dtype = i64} : i64[?s]`
    """

    name = "arange"
    attributes = attr_table(
        shape=Attr("shape"),
        start=Attr("float", 0.0),
        step=Attr("float", 1.0),
        dtype=Attr("dtype", dtypes.i64),
    )

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        shape = tuple(attrs["shape"])
        if len(shape) != 1 or (isinstance(shape[0], int) and shape[0] < 0):
            raise ShapeError(f"arange: shape must be one length >= 0, got {list(shape)}")
        return [TensorType(shape, attrs["dtype"])]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        (n,) = attrs["shape"]
        values = attrs["start"] + attrs["step"] * np.arange(n, dtype=np.float64)
        return values.astype(attrs["dtype"].np_dtype)


@register
class Index(OpDef):
    """Advanced indexing `x[..., i0, i1, ...]` as NumPy and PyTorch do it.

    Index tensor j selects along axis `axes[j]`; the index tensors broadcast together. When the
    indexed axes are adjacent the broadcast dims replace them in place, otherwise they come
    first. Negative indices count from the end; out-of-range ones are a run-time error.
    `%y = index(%mask, %i, %j) {axes = [0, 1]} : bool[?b,1,1,?s]`
    """

    name = "index"
    operands = ("x", "*indices")
    attributes = attr_table(axes=Attr("ints"))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        x, *idx = types
        axes = tuple(attrs["axes"])
        if not idx or len(idx) != len(axes):
            raise ShapeError(f"index: needs one axis per index tensor, got {list(axes)} for {idx}")
        if tuple(normalize_axes("index", axes, x.rank)) != tuple(a % x.rank for a in axes):
            raise ShapeError(f"index: axes {list(axes)} must be increasing")
        for t in idx:
            if not t.dtype.is_integer:
                raise DTypeError(f"index: index tensors must be integers, got {t}")
        bshape = broadcast_shapes("index", *(t.shape for t in idx))
        norm = [a % x.rank for a in axes]
        rest = [d for i, d in enumerate(x.shape) if i not in norm]
        if norm == list(range(norm[0], norm[0] + len(norm))):
            shape = (*x.shape[: norm[0]], *bshape, *x.shape[norm[-1] + 1 :])
        else:
            shape = (*bshape, *rest)
        return [TensorType(tuple(shape), x.dtype)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        x, *idx = args
        key: list = [slice(None)] * x.ndim
        for axis, i in zip(attrs["axes"], idx, strict=True):
            size = x.shape[axis]
            if i.size and (i.min() < -size or i.max() >= size):
                raise ShapeError(
                    f"index: index out of range [{-size}, {size}) for axis {axis} of shape "
                    f"{list(x.shape)} (got {i.min()}..{i.max()})"
                )
            key[axis] = i.astype(np.int64)
        return np.asarray(x[tuple(key)])
