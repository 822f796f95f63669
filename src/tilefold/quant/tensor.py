"""`QuantizedTensor`: packed codes, blockwise scales (zero points, offsets), checked on creation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefold.dtypes import DType
from tilefold.dtypes import dtype as to_dtype
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.ops.quant import Dequantize, ScaleError, block_shape, expand_blocks
from tilefold.quant.formats import Format, get_format
from tilefold.quant.packing import pack_nibbles, unpack_nibbles


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A tensor of `shape` stored as codes of `format`, quantized in blocks along `axis`.

    `scale` (f32) has the data's rank and tiles it (see tilefold.ir.ops.quant): [1, 1] per
    tensor, [1, N] per channel, [K/g, N] groups of g along axis 0. `data` holds the codes,
    4-bit ones packed two per byte along `axis`. A value is (code - zero_point) * scale
    + offset: `offset` (f32, the scale's shape) is a block's minimum where the format stores one
    (GGUF's Q4_1: w = q * d + m). Scales may be negative or zero (GGUF's Q4_0 stores the sign of
    a block's largest value in its scale; an all-zero block has scale 0): `quantize` makes
    positive ones. Kernels keep their own layouts of the same data in `kernel_layouts` (built
    once, on first use).
    """

    format: Format
    shape: tuple[int, ...]
    axis: int
    data: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None = None
    offset: np.ndarray | None = None
    kernel_layouts: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        op = f"QuantizedTensor({self.format.name})"
        if not -len(self.shape) <= self.axis < len(self.shape):
            raise ShapeError(f"{op}: axis {self.axis} is out of range for shape {list(self.shape)}")
        object.__setattr__(self, "axis", self.axis % len(self.shape))
        want = list(self.shape)
        if self.format.bits == 4:
            want[self.axis] //= 2
        if self.shape[self.axis] % (2 if self.format.bits == 4 else 1) or \
                list(self.data.shape) != want or self.data.dtype != self.storage_dtype:
            raise ShapeError(
                f"{op}: data is {self.data.dtype}{list(self.data.shape)}, expected "
                f"{self.storage_dtype}{want} for shape {list(self.shape)}; build it with "
                "tilefold.quantize()"
            )
        block_shape(op, self.shape, self.scale.shape)
        for name in ("scale", "offset"):
            values = getattr(self, name)
            if values is None:
                continue
            if values.dtype != np.float32 or values.shape != self.scale.shape:
                raise DTypeError(f"{op}: {name} must be float32{list(self.scale.shape)}, got "
                                 f"{values.dtype}{list(values.shape)}")
            bad = ~np.isfinite(values)
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ScaleError(f"{op}: {name}{list(where)} = {values[where]!r} (shape "
                                 f"{list(values.shape)}); scales and offsets must be finite")
        if self.zero_point is not None:
            code = self.format.asymmetric_code
            if code is None:
                raise DTypeError(f"{op}: {self.format.name} is symmetric; drop the zero point")
            if self.zero_point.shape != self.scale.shape or \
                    self.zero_point.dtype != code.np_dtype:
                raise ShapeError(
                    f"{op}: zero point is {self.zero_point.dtype}{list(self.zero_point.shape)}, "
                    f"expected {code}{list(self.scale.shape)} (the scale's shape)"
                )

    @property
    def code(self) -> DType:
        """The dtype of one code (i8, u8, i4, fp8e4m3, fp4e2m1)."""
        if self.zero_point is not None and self.format.asymmetric_code is not None:
            return self.format.asymmetric_code
        return self.format.code

    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.format.bits == 4 else self.code.np_dtype

    @property
    def group_size(self) -> int:
        """Elements along `axis` that share one scale."""
        return self.shape[self.axis] // self.scale.shape[self.axis]

    @property
    def nbytes(self) -> int:
        """Bytes of codes, scales and zero points: what a kernel streams from memory."""
        extra = (0 if a is None else a.nbytes for a in (self.zero_point, self.offset))
        return self.data.nbytes + self.scale.nbytes + sum(extra)

    def codes(self) -> np.ndarray:
        """The codes, one element per value (4-bit ones unpacked into ml_dtypes arrays)."""
        if self.format.bits == 4:
            return unpack_nibbles(self.data, self.axis, self.code)
        return self.data

    def dequantize(self, dtype: str | DType = "f32") -> np.ndarray:
        """The real values (q - zero_point) * scale + offset, computed in f64 and rounded once
        (the IR's `dequantize` op where there is no offset)."""
        dt = to_dtype(dtype)
        args = [self.codes(), self.scale]
        if self.zero_point is not None:
            args.append(self.zero_point)
        if self.offset is None and (self.scale > 0).all():
            return Dequantize.reference(args, {"dtype": dt})
        y = args[0].astype(np.float64)
        if self.zero_point is not None:
            y = y - expand_blocks(self.zero_point.astype(np.float64), self.shape)
        y = y * expand_blocks(self.scale.astype(np.float64), self.shape)
        if self.offset is not None:
            y = y + expand_blocks(self.offset.astype(np.float64), self.shape)
        return y.astype(dt.np_dtype)

    @staticmethod
    def from_codes(fmt: str | Format, codes: np.ndarray, axis: int, scale: np.ndarray,
                   zero_point: np.ndarray | None = None,
                   offset: np.ndarray | None = None) -> QuantizedTensor:
        """Wrap existing codes (one per element) and scales, packing 4-bit codes."""
        fmt = get_format(fmt)
        data = pack_nibbles(codes, axis % codes.ndim) if fmt.bits == 4 else codes
        return QuantizedTensor(fmt, tuple(codes.shape), axis, data, scale, zero_point, offset)

    def __repr__(self) -> str:
        kind = "asymmetric" if self.zero_point is not None else "symmetric"
        kind += ", with offsets" if self.offset is not None else ""
        return (f"QuantizedTensor({self.format.name}, shape={list(self.shape)}, axis={self.axis}, "
                f"group={self.group_size}, {kind})")
