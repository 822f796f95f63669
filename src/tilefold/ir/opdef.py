"""Op declarations: each op is declared once, as a class, and everything else derives from it.

An `OpDef` subclass names the op, its operands, attributes and traits, infers result types and
carries the NumPy reference implementation. The printer, parser, verifier, builder and the
reference interpreter all read these declarations; none of them knows individual ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tilefold.dtypes import DType
from tilefold.dtypes import dtype as to_dtype
from tilefold.errors import TilefoldError
from tilefold.ir.types import TensorType, dim

REQUIRED = object()

# Attribute kinds: how a value is checked, normalized, printed and parsed.
ATTR_KINDS = ("int", "float", "bool", "str", "ints", "shape", "dtype", "dense")


@dataclass(frozen=True)
class Attr:
    """An attribute declaration: its kind, default (REQUIRED if none) and allowed string values."""

    kind: str
    default: Any = REQUIRED
    choices: tuple[str, ...] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        assert self.kind in ATTR_KINDS, self.kind

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def normalize(self, value: Any) -> Any:
        """Coerce a Python value to this attribute's canonical form or raise TypeError."""
        if self.kind == "int" and not isinstance(value, bool):
            return int(_exact_int(value))
        if self.kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if self.kind == "bool" and isinstance(value, bool | np.bool_):
            return bool(value)
        if self.kind == "str" and isinstance(value, str):
            if self.choices and value not in self.choices:
                raise TypeError(f"expected one of {', '.join(self.choices)}, got {value!r}")
            return value
        if self.kind == "ints" and isinstance(value, list | tuple):
            return tuple(int(_exact_int(v)) for v in value)
        if self.kind == "shape" and isinstance(value, list | tuple):
            return tuple(dim(v) for v in value)
        if self.kind == "dtype" and isinstance(value, str | DType):
            return to_dtype(value)
        if self.kind == "dense" and isinstance(value, np.ndarray):
            return value
        raise TypeError(f"expected a {self.kind} attribute, got {value!r}")


def _exact_int(value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


class OpDef:
    """Base of op declarations. Subclasses set the class attributes and override `infer`.

    operands: operand names; a name starting with `*` is variadic (only as the last one).
    results:  number of results, or -1 when `infer` decides.
    traits:   "pure", "elementwise", "commutative", "reduction", "layout", "terminator", ...
    """

    name: ClassVar[str]
    operands: ClassVar[tuple[str, ...]] = ()
    attributes: ClassVar[dict[str, Attr]] = {}
    traits: ClassVar[frozenset[str]] = frozenset({"pure"})
    results: ClassVar[int] = 1
    regions: ClassVar[int] = 0

    @classmethod
    def arity(cls) -> tuple[int, int | None]:
        """(minimum, maximum) operand count; maximum None means unbounded."""
        if cls.operands and cls.operands[-1].startswith("*"):
            return len(cls.operands) - 1, None
        return len(cls.operands), len(cls.operands)

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        """Result types from operand types and (normalized, defaults filled) attributes."""
        raise NotImplementedError(f"{cls.name} must declare infer()")

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        """The op's meaning on NumPy arrays: one array, or a list for several results."""
        raise NotImplementedError(f"{cls.name} has no reference implementation")

    @classmethod
    def full_attrs(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        """Attributes with declared defaults filled in."""
        full = {k: spec.default for k, spec in cls.attributes.items() if not spec.required}
        full.update(attrs)
        return full


OPS: dict[str, type[OpDef]] = {}


def register(cls: type[OpDef]) -> type[OpDef]:
    """Class decorator adding an op declaration to the registry (a duplicate name is a bug)."""
    if cls.name in OPS:
        raise TilefoldError(f"op {cls.name!r} is declared twice ({OPS[cls.name]} and {cls})")
    OPS[cls.name] = cls
    return cls


def lookup(name: str) -> type[OpDef] | None:
    return OPS.get(name)

