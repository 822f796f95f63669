"""Quantize and dequantize: float tensors to low-precision codes and back, with blockwise scales.

One rule covers per-tensor, per-channel and group-wise quantization: `scale` has the rank of the
data and each of its dims divides the data's, so scale[i] covers a block of data.shape/scale.shape
elements (scale [1, 1]: per tensor; [1, N]: per column; [K/32, N]: groups of 32 along K). A
zero point, when given, has the scale's shape and the code dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.dtypes import DType
from tilefold.errors import DTypeError, ShapeError, TilefoldError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.types import TensorType

# Code dtypes and their representable range (floats saturate to ±max rather than overflow).
CODE_RANGES: dict[str, tuple[float, float]] = {
    "i8": (-128, 127),
    "u8": (0, 255),
    "i4": (-8, 7),
    "fp8e4m3": (-448.0, 448.0),
    "fp4e2m1": (-6.0, 6.0),
}


class ScaleError(TilefoldError):
    """Quantization scales or zero points that cannot be used (zero, negative, non-finite)."""


def block_shape(op: str, shape: tuple, scale_shape: tuple) -> tuple[int, ...]:
    """Elements each scale covers per dim; ShapeError unless scale dims divide the data's."""
    if len(scale_shape) != len(shape) or any(
        isinstance(d, int) and (s < 1 or d % s) for d, s in zip(shape, scale_shape, strict=True)
    ):
        raise ShapeError(
            f"{op}: scale shape {list(scale_shape)} does not tile data shape {list(shape)}; "
            "give the scale the data's rank with each dim dividing the data's "
            "([1, N] per column, [K/group, N] group-wise along K)"
        )
    return tuple(
        d // s if isinstance(d, int) else 1 for d, s in zip(shape, scale_shape, strict=True)
    )


def expand_blocks(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Blockwise `values` repeated to the full data `shape`."""
    out = values
    for axis, rep in enumerate(block_shape("expand", shape, values.shape)):
        if rep > 1:
            out = np.repeat(out, rep, axis=axis)
    return out


def check_scales(op: str, scale: np.ndarray) -> None:
    """ScaleError naming the first bad scale: each must be finite and > 0."""
    scale = np.asarray(scale, dtype=np.float64)
    bad = ~(np.isfinite(scale) & (scale > 0))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ScaleError(
            f"{op}: scale{list(where)} = {scale[where]!r} (scale shape {list(scale.shape)}); "
            "scales must be finite and > 0 — recompute them from the data (an all-zero block "
            "takes scale 1)"
        )


def _code_dtype(op: str, dt: DType) -> tuple[float, float]:
    if dt.name not in CODE_RANGES:
        raise DTypeError(
            f"{op}: no quantized format with codes of dtype {dt}; "
            f"use one of {', '.join(CODE_RANGES)}"
        )
    return CODE_RANGES[dt.name]


def _check_operands(
    op: str, data: TensorType, scale: TensorType, zp: list[TensorType], code: DType
) -> None:
    if not scale.dtype.is_float:
        raise DTypeError(f"{op}: scale must be a float tensor, got {scale}")
    block_shape(op, data.shape, scale.shape)
    if len(zp) > 1:
        raise ShapeError(f"{op}: takes at most one zero point, got {len(zp)}")
    if zp:
        if zp[0].shape != scale.shape or zp[0].dtype != code:
            raise ShapeError(
                f"{op}: zero point {zp[0]} must have the scale's shape {list(scale.shape)} "
                f"and the code dtype {code}"
            )
        if not code.is_integer:
            raise DTypeError(f"{op}: {code} codes are symmetric; drop the zero point")


@register
class Quantize(OpDef):
    """Codes of `x`: clip(round_half_even(x / scale) + zero_point) for integer codes, the nearest
    value of x / scale saturated to ±max for float codes (fp8e4m3, fp4e2m1).

    `%q = quantize(%w, %s) {dtype = "i4"} : i4[64,16]`
    """

    name = "quantize"
    operands = ("x", "scale", "*zero_point")
    attributes = attr_table(dtype=Attr("dtype", doc="the code dtype: i8, u8, i4, fp8e4m3, fp4e2m1"))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        x, scale, *zp = types
        _code_dtype(cls.name, attrs["dtype"])
        if not x.dtype.is_float:
            raise DTypeError(f"quantize: x must be a float tensor, got {x}; cast it first")
        _check_operands(cls.name, x, scale, zp, attrs["dtype"])
        return [TensorType(x.shape, attrs["dtype"])]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        x, scale, *zp = args
        code: DType = attrs["dtype"]
        lo, hi = _code_dtype(cls.name, code)
        check_scales(cls.name, scale)
        with np.errstate(all="ignore"):
            y = x.astype(np.float64) / expand_blocks(scale.astype(np.float64), x.shape)
        if code.is_integer:
            y = np.rint(y)
            if zp:
                y = y + expand_blocks(zp[0].astype(np.float64), x.shape)
        return np.clip(y, lo, hi).astype(code.np_dtype)


@register
class Dequantize(OpDef):
    """Real values of codes `q`: (q - zero_point) * scale, computed in f64, rounded to `dtype`.

    `%w = dequantize(%q, %s) {dtype = "f32"} : f32[64,16]`
    """

    name = "dequantize"
    operands = ("q", "scale", "*zero_point")
    attributes = attr_table(dtype=Attr("dtype", dtypes.f32, doc="the result dtype (a float)"))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        q, scale, *zp = types
        _code_dtype(cls.name, q.dtype)
        if not attrs["dtype"].is_float:
            raise DTypeError(f"dequantize: result dtype must be a float, got {attrs['dtype']}")
        _check_operands(cls.name, q, scale, zp, q.dtype)
        return [TensorType(q.shape, attrs["dtype"])]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        q, scale, *zp = args
        check_scales(cls.name, scale)
        y = q.astype(np.float64)
        if zp:
            y = y - expand_blocks(zp[0].astype(np.float64), q.shape)
        y = y * expand_blocks(scale.astype(np.float64), q.shape)
        return y.astype(attrs["dtype"].np_dtype)
