"""Normalization ops: layer_norm and rms_norm over the trailing axes."""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import ShapeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.ops.common import evaluate, require, same_dtype
from tilefold.ir.shapes import normalize_axis
from tilefold.ir.types import TensorType


class Norm(OpDef):
    """Normalizes x over axes [axis, rank); the affine operands have the shape of those axes."""

    attributes = attr_table(axis=Attr("int", -1), eps=Attr("float", 1e-5))
    traits = frozenset({"pure", "reduction", "normalizing", "lowered"})

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        x, *affine = types
        require(cls.name, x, "float")
        same_dtype(cls.name, types)
        axis = normalize_axis(cls.name, attrs["axis"], x.rank)
        for t in affine:
            if t.shape != x.shape[axis:]:
                raise ShapeError(
                    f"{cls.name}: weight/bias shape {t} must equal the normalized dims "
                    f"[{','.join(map(str, x.shape[axis:]))}] of {x}"
                )
        return [x.without_layout()]

    @classmethod
    def reduced_axes(cls, rank: int, attrs: dict[str, Any]) -> tuple[int, ...]:
        return tuple(range(normalize_axis(cls.name, attrs["axis"], rank), rank))


@register
class LayerNorm(Norm):
    """(x - mean) / sqrt(var + eps) * weight + bias, biased variance, as torch.layer_norm.

    `%y = layer_norm(%x, %w, %b) {eps = 1e-12} : f32[8,384]`
    """

    name = "layer_norm"
    operands = ("x", "weight", "bias")

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        axes = cls.reduced_axes(args[0].ndim, attrs)

        def fn(x, w, b):
            mean = x.mean(axis=axes, keepdims=True)
            var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
            return (x - mean) / np.sqrt(var + attrs["eps"]) * w + b

        return evaluate(fn, args, dtypes.dtype(args[0].dtype))


@register
class RmsNorm(Norm):
    """x / sqrt(mean(x**2) + eps) * weight, as LLaMA's RMSNorm.

    `%y = rms_norm(%x, %w) {eps = 1e-6} : f32[8,4096]`
    """

    name = "rms_norm"
    operands = ("x", "weight")

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        axes = cls.reduced_axes(args[0].ndim, attrs)

        def fn(x, w):
            return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + attrs["eps"]) * w

        return evaluate(fn, args, dtypes.dtype(args[0].dtype))
