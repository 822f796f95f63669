"""Matrix multiplication with NumPy's matmul semantics, transpose flags and batch broadcasting."""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import ShapeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.ops.common import evaluate, require, same_dtype
from tilefold.ir.shapes import broadcast_shapes
from tilefold.ir.types import TensorType


def _swap_last(shape):
    return (*shape[:-2], shape[-1], shape[-2]) if len(shape) >= 2 else shape


def _operand_dtype(types: list[TensorType]) -> dtypes.DType:
    """The operands' one dtype; u8 @ i8 (unsigned activations, signed weights) counts as i8."""
    if [t.dtype for t in types] == [dtypes.u8, dtypes.i8]:
        return dtypes.i8
    return same_dtype("matmul", types)


def _result_dtype(dt: dtypes.DType) -> dtypes.DType:
    """Integers accumulate and return in i32 (i64 for i64); floats keep their dtype."""
    if dt.is_integer:
        return dtypes.i64 if dt == dtypes.i64 else dtypes.i32
    return dt


@register
class Matmul(OpDef):
    """`a @ b` as np.matmul: [..., M, K] @ [..., K, N] -> [..., M, N], batch dims broadcast.

    A 1-D `a` is a row vector and a 1-D `b` a column vector (the unit dim is dropped).
    `transpose_a`/`transpose_b` swap the last two dims of a rank >= 2 operand first.
    Integer operands accumulate in i32 (i64 for i64); `a` may be u8 with an i8 `b` (the
    8-bit GEMM's quantized activations and weights). `%c = matmul(%a, %b) : f32[8,16]`
    """

    name = "matmul"
    operands = ("a", "b")
    attributes = attr_table(transpose_a=Attr("bool", False), transpose_b=Attr("bool", False))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        a, b = types
        dt = _operand_dtype(types)
        require("matmul", a, "numeric")
        sa = _swap_last(a.shape) if attrs["transpose_a"] else a.shape
        sb = _swap_last(b.shape) if attrs["transpose_b"] else b.shape
        if not sa or not sb:
            raise ShapeError(f"matmul: operands must have rank >= 1, got {a} and {b}")
        ma = (1, *sa) if len(sa) == 1 else sa
        mb = (*sb, 1) if len(sb) == 1 else sb
        if ma[-1] != mb[-2]:
            raise ShapeError(
                f"matmul: contraction dims differ: {a} @ {b} "
                f"(K = {ma[-1]} vs {mb[-2]}); transpose or reshape an operand"
            )
        batch = broadcast_shapes("matmul", ma[:-2], mb[:-2])
        shape = (*batch, *([ma[-2]] if len(sa) > 1 else []), *([mb[-1]] if len(sb) > 1 else []))
        return [TensorType(tuple(shape), _result_dtype(dt))]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        a, b = args
        if attrs["transpose_a"] and a.ndim >= 2:
            a = np.swapaxes(a, -1, -2)
        if attrs["transpose_b"] and b.ndim >= 2:
            b = np.swapaxes(b, -1, -2)
        return evaluate(np.matmul, [a, b], _result_dtype(dtypes.dtype(a.dtype)))
