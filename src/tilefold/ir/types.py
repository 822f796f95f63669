"""Tensor types: a shape of static or named symbolic dims, an element dtype, optional strides."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tilefold.dtypes import DType
from tilefold.dtypes import dtype as to_dtype
from tilefold.errors import ShapeError

SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class SymDim:
    """A dimension known only by name until run time, e.g. `?batch`."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not SYMBOL.fullmatch(self.name):
            raise ShapeError(f"symbolic dim name {self.name!r} is not an identifier")

    def __str__(self) -> str:
        return f"?{self.name}"


Dim = int | SymDim


def dim(spec: int | str | SymDim) -> Dim:
    """Normalize a dim spec: `8` -> 8, `"batch"` or `"?batch"` -> SymDim("batch")."""
    if isinstance(spec, SymDim):
        return spec
    if isinstance(spec, str):
        return SymDim(spec.removeprefix("?"))
    return int(spec)


@dataclass(frozen=True)
class TensorType:
    """The type of an SSA value: `f32[?batch,768]`, or with element strides `f32[4,8]{1,4}`.

    `strides` is None for the default (row-major, contiguous) layout.
    """

    shape: tuple[Dim, ...]
    dtype: DType
    strides: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for d in self.shape:
            if not isinstance(d, SymDim) and (type(d) is not int or d < 0):
                raise ShapeError(f"bad dimension {d!r} in a tensor type: use an int >= 0 or ?name")
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise ShapeError(f"{len(self.strides)} strides given for a rank-{len(self.shape)} type")

    @staticmethod
    def of(
        dtype: str | DType,
        shape: Sequence[int | str | SymDim] = (),
        strides: Sequence[int] | None = None,
    ) -> TensorType:
        return TensorType(
            tuple(dim(d) for d in shape),
            to_dtype(dtype),
            None if strides is None else tuple(int(s) for s in strides),
        )

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def symbols(self) -> set[str]:
        return {d.name for d in self.shape if isinstance(d, SymDim)}

    @property
    def num_elements(self) -> int:
        """Element count of a static type."""
        assert self.is_static, f"{self} has symbolic dims"
        return math.prod(self.shape)  # type: ignore[arg-type]

    def with_shape(self, shape: Sequence[int | str | SymDim]) -> TensorType:
        return TensorType(tuple(dim(d) for d in shape), self.dtype)

    def with_dtype(self, dtype: str | DType) -> TensorType:
        return TensorType(self.shape, to_dtype(dtype), self.strides)

    def without_layout(self) -> TensorType:
        return TensorType(self.shape, self.dtype) if self.strides is not None else self

    def bind(self, bindings: dict[str, int]) -> TensorType:
        """Replace symbolic dims that `bindings` names with their sizes."""
        shape = tuple(bindings.get(d.name, d) if isinstance(d, SymDim) else d for d in self.shape)
        return TensorType(shape, self.dtype, self.strides)

    def __str__(self) -> str:
        text = f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
        if self.strides is not None:
            text += "{" + ",".join(str(s) for s in self.strides) + "}"
        return text
