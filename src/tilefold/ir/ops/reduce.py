"""Reductions over axes (sum, max, min, mean), the softmax family and the running sum."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import ShapeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.ops.common import evaluate, require
from tilefold.ir.shapes import normalize_axes, normalize_axis
from tilefold.ir.types import TensorType


class Reduce(OpDef):
    """Base of `%y = NAME(%x) {axes = [1], keepdims = false} : T`; no `axes` reduces all."""

    operands = ("x",)
    attributes = attr_table(axes=Attr("ints", None), keepdims=Attr("bool", False))
    traits = frozenset({"pure", "reduction", "lowered"})
    accepts = "numeric"  # operand kinds, see common._ACCEPTS
    identity_free = False  # max/min have no identity: reducing an empty axis is an error

    @staticmethod
    def fn(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def reduced_axes(cls, rank: int, attrs: dict[str, Any]) -> tuple[int, ...]:
        return normalize_axes(cls.name, attrs["axes"], rank)

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        require(cls.name, x, cls.accepts)
        axes = cls.reduced_axes(x.rank, attrs)
        if cls.identity_free and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{cls.name}: cannot reduce the empty axis of {x}")
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return [TensorType(shape, x.dtype)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        (x,) = args
        axes = cls.reduced_axes(x.ndim, attrs)
        if cls.identity_free and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{cls.name}: cannot reduce an empty axis of shape {list(x.shape)}")
        return evaluate(
            lambda v: cls.fn(v, axis=axes, keepdims=attrs["keepdims"]), args, dtypes.dtype(x.dtype)
        )


def reduction(
    name: str,
    fn: Callable[..., np.ndarray],
    doc: str,
    accepts: str = "numeric",
    identity_free: bool = False,
) -> type[OpDef]:
    """Declare and register a reduction in one line."""
    cls = type(
        name.title().replace("_", ""),
        (Reduce,),
        {
            "name": name,
            "fn": staticmethod(fn),
            "accepts": accepts,
            "identity_free": identity_free,
            "__doc__": doc,
        },
    )
    return register(cls)


reduction("reduce_sum", np.sum, "sum over `axes`; empty axes sum to 0; integers wrap")
reduction("reduce_max", np.max, "maximum over `axes`; NaN propagates", identity_free=True)
reduction("reduce_min", np.min, "minimum over `axes`; NaN propagates", identity_free=True)
reduction("reduce_mean", np.mean, "arithmetic mean over `axes`; empty axes give NaN", "float")


def _softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


class AlongAxis(OpDef):
    """Base of ops that map x to a result of its shape and dtype along one `axis`."""

    operands = ("x",)
    accepts = "float"  # operand kinds, see common._ACCEPTS

    @staticmethod
    def fn(x: np.ndarray, axis: int) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (x,) = types
        require(cls.name, x, cls.accepts)
        normalize_axis(cls.name, attrs["axis"], x.rank)
        return [x.without_layout()]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        axis = normalize_axis(cls.name, attrs["axis"], args[0].ndim)
        return evaluate(lambda v: cls.fn(v, axis), args, dtypes.dtype(args[0].dtype))


class SoftmaxFamily(AlongAxis):
    """Base of softmax and log_softmax: normalize along one `axis`, same shape and dtype."""

    attributes = attr_table(axis=Attr("int", -1))
    traits = frozenset({"pure", "reduction", "normalizing", "lowered"})

    @classmethod
    def reduced_axes(cls, rank: int, attrs: dict[str, Any]) -> tuple[int, ...]:
        return (normalize_axis(cls.name, attrs["axis"], rank),)


@register
class Softmax(SoftmaxFamily):
    """exp(x - max) / sum(exp(x - max)) along `axis`. `%y = softmax(%x) {axis = 1} : f32[2,8]`"""

    name = "softmax"
    fn = staticmethod(_softmax)


@register
class LogSoftmax(SoftmaxFamily):
    """log(softmax(x)) along `axis`, computed without forming softmax (no log(0) underflow)."""

    name = "log_softmax"
    fn = staticmethod(_log_softmax)


@register
class Cumsum(AlongAxis):
    """Running sum along `axis`: y[..., i, ...] = sum of x[..., :i+1, ...]; same shape and
    dtype; integers wrap, floats are summed in f64 and rounded once.
    `%y = cumsum(%x) {axis = 1} : i64[2,9]`"""

    name = "cumsum"
    attributes = attr_table(axis=Attr("int"))
    traits = frozenset({"pure"})
    accepts = "numeric"
    fn = staticmethod(lambda x, axis: np.cumsum(x, axis=axis))
