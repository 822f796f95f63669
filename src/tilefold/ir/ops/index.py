"""Index-producing and index-consuming ops: `arange` (iota), `dim_size` (a size as a value),
NumPy-style advanced `index`, and `index_put`, its write."""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.shapes import broadcast_shapes, normalize_axes, normalize_axis
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
class DimSize(OpDef):
    """The length of one axis of `x` as a 0-d i64: how a symbolic size enters arithmetic (a KV
    cache's length added to positions). Only `x`'s shape is read, never its elements.

    `%n = dim_size(%k) {axis = 2} : i64[]`
    """

    name = "dim_size"
    operands = ("x",)
    attributes = attr_table(axis=Attr("int"))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        normalize_axis("dim_size", attrs["axis"], types[0].rank)
        return [TensorType((), dtypes.i64)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return np.asarray(args[0].shape[attrs["axis"]], dtype=np.int64)


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
        return np.asarray(x[index_key("index", x.shape, attrs["axes"], idx)])


@register
class IndexPut(OpDef):
    """`x` with the elements `index` would select replaced by `values` (broadcast to them):
    PyTorch's `index_put`, a KV cache's row write. Where indices repeat, the last write wins
    (as NumPy's assignment; PyTorch leaves that order unspecified). With `accumulate`, the
    values are added to those elements instead, every repeat counted (`np.add.at`, in x's
    dtype): an embedding's gradient, the rows of each token summed into its id's row.

    `%c2 = index_put(%cache, %kv, %pos) {axes = [2]} : f32[1,2,128,64]`
    """

    name = "index_put"
    operands = ("x", "values", "*indices")
    attributes = attr_table(axes=Attr("ints"), accumulate=Attr("bool", False))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        x, values, *idx = types
        (picked,) = Index.infer([x, *idx], attrs)
        if values.dtype != x.dtype:
            raise DTypeError(f"index_put: values {values} must have the dtype of {x}")
        if broadcast_shapes("index_put", values.shape, picked.shape) != picked.shape:
            raise ShapeError(f"index_put: values {values} do not broadcast to the {picked} "
                             "the indices select")
        return [x]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        x, values, *idx = args
        out = x.copy()
        put(out, values, index_key("index_put", x.shape, attrs["axes"], idx),
            attrs.get("accumulate", False))
        return out


def put(out: np.ndarray, values: np.ndarray, key: tuple, accumulate: bool) -> None:
    """`out[key] = values`, or with `accumulate` `out[key] += values` counting every repeated
    index (one sum per element, in `out`'s dtype)."""
    if accumulate:
        values = np.asarray(values, dtype=out.dtype)
        if not _add_by_occurrence(out, values, key):
            np.add.at(out, key, values)
    else:
        out[key] = values


# `_add_by_occurrence` loops once per occurrence rank; beyond this many repeats of one index,
# `np.add.at` does it in one (slow, unbuffered) pass instead.
MAX_OCCURRENCES = 16
SMALL_ADD = 1 << 12  # elements added: below, its setup costs more than `np.add.at`


def _add_by_occurrence(out: np.ndarray, values: np.ndarray, key: tuple) -> bool:
    """`np.add.at(out, key, values)` for one 1-D index array along one axis (an embedding's
    gradient: rows of a table), as buffered `+=` over index arrays without repeats: the first
    occurrence of every index, then the second, ..., so each element gets the same sums in
    the same order as `np.add.at` (bit for bit), at NumPy's vectorized speed instead of one
    element at a time. False (nothing done) for any other key or a heavily repeated index."""
    arrays = [(axis, k) for axis, k in enumerate(key) if not isinstance(k, slice)]
    if len(arrays) != 1 or arrays[0][1].ndim != 1 or any(
            k != slice(None) for k in key if isinstance(k, slice)):
        return False
    axis, index = arrays[0]
    if index.size * (out.size // max(out.shape[axis], 1)) < SMALL_ADD:
        return False
    index = index % out.shape[axis]  # -1 and size-1 are the same row (range checked)
    shape = (*out.shape[:axis], index.size, *out.shape[axis + 1:])
    try:
        values = np.broadcast_to(values, shape)
    except ValueError:
        return False
    order = np.argsort(index, kind="stable")
    ranked = index[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]]) if index.size else []
    rank = np.empty(index.size, np.int64)
    group = np.repeat(np.asarray(starts, np.int64), np.diff(np.r_[starts, index.size]))
    rank[order] = np.arange(index.size) - group
    if index.size and rank.max() >= MAX_OCCURRENCES:
        return False
    rows, vals = np.moveaxis(out, axis, 0), np.moveaxis(values, axis, 0)
    for r in range(int(rank.max()) + 1 if index.size else 0):
        chosen = rank == r
        rows[index[chosen]] += vals[chosen]
    return True


def index_key(op: str, shape: tuple[int, ...], axes: Any, indices: list[np.ndarray]) -> tuple:
    """The NumPy index of `index`/`index_put`: index arrays at `axes`, whole axes elsewhere;
    an index out of range is a ShapeError."""
    key: list = [slice(None)] * len(shape)
    for axis, i in zip(axes, indices, strict=True):
        size = shape[axis]
        if i.size and (i.min() < -size or i.max() >= size):
            raise ShapeError(
                f"{op}: index out of range [{-size}, {size}) for axis {axis} of shape "
                f"{list(shape)} (got {i.min()}..{i.max()})"
            )
        key[axis] = i.astype(np.int64)
    return tuple(key)
