"""The quantized formats as data: code dtype, range, packing density and how scales are chosen."""

from __future__ import annotations

from dataclasses import dataclass

from tilefold import dtypes
from tilefold.dtypes import DType
from tilefold.errors import DTypeError
from tilefold.ir.ops.quant import CODE_RANGES


@dataclass(frozen=True)
class Format:
    """A quantized format. `qmax` is the code that the largest |w| of a block maps to when
    symmetric; 4-bit formats pack two codes per byte along the quantization axis."""

    name: str
    code: DType
    qmax: float
    default_group: int | None
    asymmetric_code: DType | None = None  # code dtype when a zero point is used; None: symmetric

    @property
    def bits(self) -> int:
        return self.code.bits

    @property
    def is_float(self) -> bool:
        return self.code.is_float

    @property
    def code_range(self) -> tuple[float, float]:
        return CODE_RANGES[self.code.name]


FORMATS: dict[str, Format] = {
    "int8": Format("int8", dtypes.i8, 127, None, asymmetric_code=dtypes.u8),
    "int4": Format("int4", dtypes.i4, 7, 32, asymmetric_code=dtypes.i4),
    "fp8": Format("fp8", dtypes.fp8e4m3, 448.0, None),
    "fp4": Format("fp4", dtypes.fp4e2m1, 6.0, 32),
}
# "int8" lets weight-only GEMMs quantize their activations to int8 per block of 32 k (as
# llama.cpp's Q8_0 activations) for an integer dot product, where the host has one: a
# candidate beside the float path (which stays exact to f32 rounding); default "f32".
WEIGHT_ACTIVATIONS = "TILEFOLD_WEIGHT_ACTIVATIONS"

_ALIASES = {"i8": "int8", "i4": "int4", "fp8e4m3": "fp8", "fp4e2m1": "fp4"}


def get_format(name: str | Format) -> Format:
    """The format called `name` ("int8", "int4", "fp8"/"fp8e4m3", "fp4"/"fp4e2m1")."""
    if isinstance(name, Format):
        return name
    found = FORMATS.get(_ALIASES.get(name, name)) if isinstance(name, str) else None
    if found is None:
        raise DTypeError(
            f"quantize: unknown format {name!r}; use one of {', '.join(FORMATS)}"
        )
    return found
