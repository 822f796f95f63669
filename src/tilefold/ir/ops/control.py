"""Structural ops: constants and block terminators."""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.types import TensorType


@register
class Constant(OpDef):
    """A literal tensor. `%c = constant() {value = dense<f32[2] [1.0, 2.0]>} : f32[2]`"""

    name = "constant"
    attributes = attr_table(value=Attr("dense"))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        value: np.ndarray = attrs["value"]
        return [TensorType.of(dtypes.dtype(value.dtype), value.shape)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        return attrs["value"]


@register
class Return(OpDef):
    """Ends a function, naming its results. `return(%y)`"""

    name = "return"
    operands = ("*values",)
    traits = frozenset({"terminator"})

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        return []


@register
class Yield(OpDef):
    """Ends a region, naming the values it produces. `yield(%z)`"""

    name = "yield"
    operands = ("*values",)
    traits = frozenset({"terminator"})

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        return []
