"""Element types: the table of dtypes tilefold knows, their NumPy/ml_dtypes storage and traits."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tilefold.errors import DTypeError


@dataclass(frozen=True)
class DType:
    """An element type. `np_dtype` is how a host array of this type is stored: NumPy's own
    type `storage`, or ml_dtypes' (bf16, fp8, fp4, int4), imported on first use. ml_dtypes
    0.7 takes 0.9 s to import on a Zen 3 host, so a process that never meets those dtypes
    (a warm `tilefold generate`, `tilefold.load`) never pays it."""

    name: str
    bits: int
    kind: str  # "float", "int", "uint", "bool"
    storage: str  # the storage type's name in NumPy ("float32") or ml_dtypes ("bfloat16")

    @cached_property
    def np_dtype(self) -> np.dtype:
        if self.storage in NUMPY_OWN:
            return np.dtype(getattr(np, self.storage))
        return np.dtype(getattr(importlib.import_module("ml_dtypes"), self.storage))

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


NUMPY_OWN = ("float64", "float32", "float16", "int64", "int32", "int8", "uint8", "bool_")

f64 = DType("f64", 64, "float", "float64")
f32 = DType("f32", 32, "float", "float32")
f16 = DType("f16", 16, "float", "float16")
bf16 = DType("bf16", 16, "float", "bfloat16")
fp8e4m3 = DType("fp8e4m3", 8, "float", "float8_e4m3fn")
fp4e2m1 = DType("fp4e2m1", 4, "float", "float4_e2m1fn")
i64 = DType("i64", 64, "int", "int64")
i32 = DType("i32", 32, "int", "int32")
i8 = DType("i8", 8, "int", "int8")
i4 = DType("i4", 4, "int", "int4")
u8 = DType("u8", 8, "uint", "uint8")
boolean = DType("bool", 1, "bool", "bool_")

ALL_DTYPES: tuple[DType, ...] = (
    f64, f32, f16, bf16, fp8e4m3, fp4e2m1, i64, i32, i8, i4, u8, boolean,
)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NUMPY = {d.np_dtype: d for d in ALL_DTYPES if d.storage in NUMPY_OWN}


def _by_numpy(np_dtype: np.dtype) -> DType | None:
    """The DType stored as `np_dtype`. An array of one of ml_dtypes' types exists only once
    ml_dtypes is imported: until then, NumPy's own types are all there is to look at."""
    found = _BY_NUMPY.get(np_dtype)
    if found is None and "ml_dtypes" in sys.modules:
        _BY_NUMPY.update({d.np_dtype: d for d in ALL_DTYPES})
        found = _BY_NUMPY.get(np_dtype)
    return found


def dtype(spec: str | DType | np.dtype | type) -> DType:
    """Look a dtype up by tilefold name (`"f32"`), DType, or NumPy dtype."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str) and spec in _BY_NAME:
        return _BY_NAME[spec]
    try:
        found = _by_numpy(np.dtype(spec))
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
