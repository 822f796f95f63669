"""`QuantizedTensor`: packed codes plus blockwise scales (and zero points), checked on creation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefold.dtypes import DType
from tilefold.dtypes import dtype as to_dtype
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.ops.quant import Dequantize, block_shape, check_scales
from tilefold.quant.formats import Format, get_format
from tilefold.quant.packing import pack_nibbles, unpack_nibbles


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A tensor of `shape` stored as codes of `format`, quantized in blocks along `axis`.

    `scale` (f32) has the data's rank and tiles it (see tilefold.ir.ops.quant): [1, 1] per
    tensor, [1, N] per channel, [K/g, N] groups of g along axis 0. `data` holds the codes,
    4-bit ones packed two per byte along `axis`. Kernels keep their own layouts of the same
    data in `kernel_layouts` (built once, on first use).
    """

    format: Format
    shape: tuple[int, ...]
    axis: int
    data: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None = None
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
        if self.scale.dtype != np.float32:
            raise DTypeError(f"{op}: scale must be float32, got {self.scale.dtype}")
        block_shape(op, self.shape, self.scale.shape)
        check_scales(op, self.scale)
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
        zp = 0 if self.zero_point is None else self.zero_point.nbytes
        return self.data.nbytes + self.scale.nbytes + zp

    def codes(self) -> np.ndarray:
        """The codes, one element per value (4-bit ones unpacked into ml_dtypes arrays)."""
        if self.format.bits == 4:
            return unpack_nibbles(self.data, self.axis, self.code)
        return self.data

    def dequantize(self, dtype: str | DType = "f32") -> np.ndarray:
        """The real values (q - zero_point) * scale, per the IR's `dequantize` op."""
        args = [self.codes(), self.scale]
        if self.zero_point is not None:
            args.append(self.zero_point)
        return Dequantize.reference(args, {"dtype": to_dtype(dtype)})

    @staticmethod
    def from_codes(fmt: str | Format, codes: np.ndarray, axis: int, scale: np.ndarray,
                   zero_point: np.ndarray | None = None) -> QuantizedTensor:
        """Wrap existing codes (one per element) and scales, packing 4-bit codes."""
        fmt = get_format(fmt)
        data = pack_nibbles(codes, axis % codes.ndim) if fmt.bits == 4 else codes
        return QuantizedTensor(fmt, tuple(codes.shape), axis, data, scale, zero_point)

    def __repr__(self) -> str:
        kind = "asymmetric" if self.zero_point is not None else "symmetric"
        return (f"QuantizedTensor({self.format.name}, shape={list(self.shape)}, axis={self.axis}, "
                f"group={self.group_size}, {kind})")
