"""Layout ops: reshape, transpose, slice, concat, broadcast_to, expand_dims, squeeze, gather.

The ops whose result is a view of their operand (reshape where the memory allows one; unit
dims inserted or dropped by a reshape, as np.expand_dims does) declare it once, as
`view(x, attrs)` on NumPy arrays and torch tensors alike (`tilefold.ir.arrays`): their
reference, the compiled CPU graph, the GPU graph and the extern method all make it so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.arrays import namespace
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.ops.common import same_dtype
from tilefold.ir.shapes import broadcast_shapes, normalize_axes, normalize_axis, resolve_reshape
from tilefold.ir.types import SymDim, TensorType, dim_sum

LAYOUT = frozenset({"pure", "layout"})
END = 2**63 - 1  # a slice stop meaning "to the end of the axis"
BEGIN = -(2**63)  # a slice stop meaning "to the beginning" (with a negative step)
WHOLE = ((0, END, 1), (-1, BEGIN, -1))  # the (start, stop, step) that keep a symbolic dim whole


def _shape_text(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


@register
class Reshape(OpDef):
    """Same elements, new shape (row-major order); one size may be -1.

    `%y = reshape(%x) {shape = [?b,12,64]} : f32[?b,12,64]`
    """

    name = "reshape"
    operands = ("x",)
    attributes = attr_table(shape=Attr("shape"))
    traits = LAYOUT

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        return [TensorType(resolve_reshape("reshape", x.shape, attrs["shape"]), x.dtype)]

    @staticmethod
    def view(x: Any, attrs: dict[str, Any]) -> Any:
        return namespace(x).reshape(x, tuple(attrs["shape"]))

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return cls.view(args[0], attrs)


@register
class Transpose(OpDef):
    """Permute axes: result axis i is input axis perm[i]. `%y = transpose(%x) {perm = [1,0]}`"""

    name = "transpose"
    operands = ("x",)
    attributes = attr_table(perm=Attr("ints"))
    traits = LAYOUT

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        perm = attrs["perm"]
        if sorted(perm) != list(range(x.rank)):
            raise ShapeError(f"transpose: perm {list(perm)} is not a permutation of {x.rank} axes")
        return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]

    @staticmethod
    def view(x: Any, attrs: dict[str, Any]) -> Any:
        return namespace(x).permute_dims(x, tuple(attrs["perm"]))

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return cls.view(args[0], attrs)


@register
class Slice(OpDef):
    """Python slicing per axis: x[starts[i]:stops[i]:steps[i]], clamped like NumPy.

    A stop of 9223372036854775807 means "to the end", -9223372036854775808 "to the beginning".
    Symbolic dims can only be kept whole (`[0:END:1]`) or reversed (`[-1:BEGIN:-1]`).
    `%y = slice(%x) {starts = [0,1], stops = [4,9223372036854775807], steps = [1,2]}`
    """

    name = "slice"
    operands = ("x",)
    attributes = attr_table(starts=Attr("ints"), stops=Attr("ints"), steps=Attr("ints"))
    traits = LAYOUT

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
        if not len(starts) == len(stops) == len(steps) == x.rank:
            raise ShapeError(f"slice: starts/stops/steps need {x.rank} entries each for {x}")
        shape = []
        for d, start, stop, step in zip(x.shape, starts, stops, steps, strict=True):
            if step == 0:
                raise ShapeError("slice: a step cannot be 0")
            if isinstance(d, SymDim):
                if (start, stop, step) not in WHOLE:
                    raise ShapeError(
                        f"slice: symbolic dim {d} of {x} can only be kept whole or reversed"
                    )
                shape.append(d)
            else:
                shape.append(len(range(*slice(start, stop, step).indices(d))))
        return [TensorType(tuple(shape), x.dtype)]

    @staticmethod
    def view(x: Any, attrs: dict[str, Any]) -> Any:
        return x[slice_index(attrs)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return cls.view(args[0], attrs)


def slice_index(attrs: dict[str, Any]) -> tuple[slice, ...]:
    """A slice op's attributes as the index that makes its view (NumPy's or torch's)."""
    return tuple(slice(*s) for s in zip(attrs["starts"], attrs["stops"], attrs["steps"],
                                        strict=True))


@register
class Concat(OpDef):
    """Join tensors along `axis`; other dims must agree. `%z = concat(%x, %y) {axis = 0}`"""

    name = "concat"
    operands = ("*inputs",)
    attributes = attr_table(axis=Attr("int", 0))
    traits = LAYOUT

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        if not types:
            raise ShapeError("concat: needs at least one operand")
        dt = same_dtype("concat", types)
        rank = types[0].rank
        axis = normalize_axis("concat", attrs["axis"], rank)
        if any(t.rank != rank for t in types):
            raise ShapeError(f"concat: operands differ in rank: {', '.join(map(str, types))}")
        for i in range(rank):
            if i != axis and len({t.shape[i] for t in types}) > 1:
                raise ShapeError(
                    f"concat: dim {i} differs: {', '.join(map(str, types))}; only axis "
                    f"{axis} may differ"
                )
        shape = list(types[0].shape)
        shape[axis] = dim_sum(*(t.shape[axis] for t in types))
        return [TensorType(tuple(shape), dt)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return np.concatenate(args, axis=attrs["axis"])


@register
class BroadcastTo(OpDef):
    """Repeat unit dims (and add leading ones) up to `shape`, as np.broadcast_to."""

    name = "broadcast_to"
    operands = ("x",)
    attributes = attr_table(shape=Attr("shape"))
    traits = LAYOUT

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        shape = tuple(attrs["shape"])
        if broadcast_shapes("broadcast_to", x.shape, shape) != shape:
            raise ShapeError(
                f"broadcast_to: {x} does not broadcast to {_shape_text(shape)} without "
                "changing the target"
            )
        return [TensorType(shape, x.dtype)]

    @staticmethod
    def view(x: Any, attrs: dict[str, Any]) -> Any:
        return namespace(x).broadcast_to(x, tuple(attrs["shape"]))

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return cls.view(args[0], attrs).copy()


@register
class ExpandDims(OpDef):
    """Insert unit dims so that they sit at `axes` of the result."""

    name = "expand_dims"
    operands = ("x",)
    attributes = attr_table(axes=Attr("ints"))
    traits = LAYOUT

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        return [TensorType(cls.result_shape(x.shape, attrs["axes"]), x.dtype)]

    @staticmethod
    def result_shape(shape: tuple, axes: tuple[int, ...]) -> tuple:
        """`shape` with unit dims inserted to sit at `axes` of the result."""
        rank = len(shape) + len(axes)
        axes = normalize_axes("expand_dims", axes, rank)
        rest = iter(shape)
        return tuple(1 if i in axes else next(rest) for i in range(rank))

    @staticmethod
    def view(x: Any, attrs: dict[str, Any]) -> Any:
        return x.reshape(ExpandDims.result_shape(tuple(x.shape), attrs["axes"]))

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return cls.view(args[0], attrs)


@register
class Squeeze(OpDef):
    """Drop the unit dims at `axes`."""

    name = "squeeze"
    operands = ("x",)
    attributes = attr_table(axes=Attr("ints"))
    traits = LAYOUT

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        axes = normalize_axes("squeeze", attrs["axes"], x.rank)
        if any(x.shape[a] != 1 for a in axes):
            raise ShapeError(f"squeeze: axes {list(attrs['axes'])} of {x} are not all 1")
        return [TensorType(cls.result_shape(x.shape, axes), x.dtype)]

    @staticmethod
    def result_shape(shape: tuple, axes: tuple[int, ...]) -> tuple:
        """`shape` without the dims at `axes`."""
        axes = normalize_axes("squeeze", axes, len(shape))
        return tuple(d for i, d in enumerate(shape) if i not in axes)

    @staticmethod
    def view(x: Any, attrs: dict[str, Any]) -> Any:
        return x.reshape(Squeeze.result_shape(tuple(x.shape), attrs["axes"]))

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return cls.view(args[0], attrs)


@register
class Gather(OpDef):
    """np.take(x, indices, axis): embedding lookup is gather on axis 0.

    Out-of-range indices are an error at run time (negative ones count from the end).
    `%e = gather(%table, %ids) {axis = 0} : f32[8,128,384]`
    """

    name = "gather"
    operands = ("x", "indices")
    attributes = attr_table(axis=Attr("int", 0))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        x, idx = types
        if not idx.dtype.is_integer:
            raise DTypeError(f"gather: indices must be integers, got {idx}")
        axis = normalize_axis("gather", attrs["axis"], x.rank)
        return [TensorType((*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]), x.dtype)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        x, idx = args[0], args[1].astype(np.int64)
        axis = normalize_axis("gather", attrs["axis"], x.ndim)
        size = x.shape[axis]
        if idx.size and (idx.min() < -size or idx.max() >= size):
            raise ShapeError(
                f"gather: index out of range [{-size}, {size}) for axis {axis} of shape "
                f"{list(x.shape)} (got {idx.min()}..{idx.max()})"
            )
        return np.take(x, idx, axis=axis)
