"""Element types: the table of dtypes tilefold knows, their NumPy/ml_dtypes storage and traits."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from tilefold.errors import DTypeError


@dataclass(frozen=True)
class DType:
    """An element type. `np_dtype` is how a host array of this type is stored."""

    name: str
    bits: int
    kind: str  # "float", "int", "uint", "bool"
    np_dtype: np.dtype

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def itemsize(self) -> int:
        return self.np_dtype.itemsize

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"DType({self.name})"


def _d(name: str, bits: int, kind: str, np_type) -> DType:
    return DType(name, bits, kind, np.dtype(np_type))


f64 = _d("f64", 64, "float", np.float64)
f32 = _d("f32", 32, "float", np.float32)
f16 = _d("f16", 16, "float", np.float16)
bf16 = _d("bf16", 16, "float", ml_dtypes.bfloat16)
fp8e4m3 = _d("fp8e4m3", 8, "float", ml_dtypes.float8_e4m3fn)
fp4e2m1 = _d("fp4e2m1", 4, "float", ml_dtypes.float4_e2m1fn)
i64 = _d("i64", 64, "int", np.int64)
i32 = _d("i32", 32, "int", np.int32)
i8 = _d("i8", 8, "int", np.int8)
i4 = _d("i4", 4, "int", ml_dtypes.int4)
u8 = _d("u8", 8, "uint", np.uint8)
boolean = _d("bool", 1, "bool", np.bool_)

ALL_DTYPES: tuple[DType, ...] = (
    f64, f32, f16, bf16, fp8e4m3, fp4e2m1, i64, i32, i8, i4, u8, boolean,
)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NUMPY = {d.np_dtype: d for d in ALL_DTYPES}


def dtype(spec: str | DType | np.dtype | type) -> DType:
    """Look a dtype up by tilefold name (`"f32"`), DType, or NumPy dtype."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str) and spec in _BY_NAME:
        return _BY_NAME[spec]
    try:
        found = _BY_NUMPY.get(np.dtype(spec))
    except TypeError:
        found = None
    if found is None:
        known = ", ".join(_BY_NAME)
        raise DTypeError(f"unknown dtype {spec!r}; tilefold knows {known}")
    return found


def promote(a: DType, b: DType) -> DType:
    """Result dtype of mixing `a` and `b`, PyTorch's way: a float beats an int, the wider type wins.

    bf16 mixed with f16 promotes to f32; i8 with u8 to i32 (tilefold has no i16).
    """
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.kind == "bool" or b.kind == "bool":
        return b if a.kind == "bool" else a
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return f32 if a.is_float else i32
