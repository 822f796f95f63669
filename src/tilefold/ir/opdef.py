"""Op declarations: each op is declared once, as a class, and everything else derives from it.

An `OpDef` subclass names the op, its operands, attributes and traits, infers result types and
carries the NumPy reference implementation. The printer, parser, verifier, builder and the
reference interpreter all read these declarations; none of them knows individual ops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tilefold.dtypes import DType
from tilefold.dtypes import dtype as to_dtype
from tilefold.errors import DTypeError, TilefoldError, VerificationError
from tilefold.ir.types import SymDim, TensorType, dim

if TYPE_CHECKING:
    from tilefold.ir.core import Block

# How a view op makes its result from an array (NumPy's or torch's) and its attributes.
View = Callable[[Any, dict[str, Any]], Any]
# How an op with regions has one evaluated: run_region(block, arrays) -> the block's results.
RunRegion = Callable[["Block", list[np.ndarray]], list[np.ndarray]]

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
        try:
            return self._normalize(value)
        except DTypeError as exc:  # an unknown dtype name, or an array of one
            raise TypeError(exc.message) from None

    def _normalize(self, value: Any) -> Any:
        if value is None and self.default is None:
            return None
        if self.kind == "int" and _is_int(value):
            return int(value)
        if self.kind == "float" and isinstance(value, Real) and not isinstance(value, bool):
            return float(value)
        if self.kind == "bool" and isinstance(value, bool | np.bool_):
            return bool(value)
        if self.kind == "str" and isinstance(value, str):
            if self.choices and value not in self.choices:
                raise TypeError(f"expected one of {', '.join(self.choices)}, got {value!r}")
            return value
        if self.kind == "ints" and isinstance(value, list | tuple) and all(map(_is_int, value)):
            return tuple(int(v) for v in value)
        if self.kind == "shape" and isinstance(value, list | tuple) and all(map(_is_dim, value)):
            return tuple(dim(v) for v in value)
        if self.kind == "dtype" and isinstance(value, str | DType):
            return to_dtype(value)
        if self.kind == "dense" and isinstance(value, np.ndarray):
            to_dtype(value.dtype)
            return value
        raise TypeError(f"expected {_KIND_TEXT[self.kind]}, got {value!r}")


_KIND_TEXT = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "ints": "a list of integers",
    "shape": "a list of dims (integers or ?name)",
    "dtype": "a dtype name",
    "dense": "a dense<...> constant",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool | np.bool_)


def _is_dim(value: Any) -> bool:
    return _is_int(value) or isinstance(value, str | SymDim)


def attr_table(**specs: Attr) -> Mapping[str, Attr]:
    """An op's attribute table, read-only so that no op can change a family's shared table."""
    return MappingProxyType(specs)


class OpDef:
    """Base of op declarations. Subclasses set the class attributes and override `infer`.

    operands: operand names; a name starting with `*` is variadic (only as the last one).
    traits:   "pure", "elementwise", "commutative", "reduction", "layout", "terminator", ...
              "lowered": codegen's op-lowering table (`codegen/lower/rules.py`) has a rule for
              the op, so fusion may put it in a generated kernel (passes cannot import codegen;
              a test checks the trait and the table agree).
              "reduction": the op reduces operand 0 over `reduced_axes`.
              "normalizing" (with "reduction"): the result has operand 0's shape, each row
              (the elements that differ only on the reduced axes) normalized on its own, and
              any further operands (a norm's weight and bias) index the reduced axes in order:
              softmax, log_softmax, layer_norm, rms_norm. What `ir/axes.py` lines up, the
              sharding rules keep whole, and split-all-reduce runs on a block of rows.
    view:     for a layout op whose result is a view of operand 0 (no copy where the memory
              allows one), `view(x, attrs)` makes it from a NumPy array or a torch tensor
              (`tilefold.ir.ops.VIEWS` lists them); None for other ops.
    regions:  how many regions (nested blocks) an instance carries.
    The number of results is whatever `infer` returns.
    """

    name: ClassVar[str]
    operands: ClassVar[tuple[str, ...]] = ()
    attributes: ClassVar[Mapping[str, Attr]] = attr_table()
    traits: ClassVar[frozenset[str]] = frozenset({"pure"})
    regions: ClassVar[int] = 0
    view: ClassVar[View | None] = None

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
    def reduced_axes(cls, rank: int, attrs: dict[str, Any]) -> tuple[int, ...]:
        """The axes of operand 0 (of rank `rank`) a "reduction" op reduces over, ascending;
        `attrs` with their defaults filled in (`full_attrs`)."""
        raise NotImplementedError(f"'{cls.name}' reduces no axes")

    @classmethod
    def infer_op(
        cls, types: list[TensorType], attrs: dict[str, Any], regions: Sequence[Block]
    ) -> list[TensorType]:
        """Result types of one op instance; an op whose regions decide them overrides this."""
        return cls.infer(types, attrs)

    @classmethod
    def reference_op(cls, args: list[np.ndarray], attrs: dict[str, Any],
                     regions: Sequence[Block], run_region: RunRegion) -> Any:
        """The meaning of one op instance; an op with regions overrides this and evaluates them
        with `run_region(block, arrays)`."""
        return cls.reference(args, attrs)

    @classmethod
    def full_attrs(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        """Attributes with declared defaults filled in."""
        full = {k: spec.default for k, spec in cls.attributes.items() if not spec.required}
        full.update(attrs)
        return full

    @classmethod
    def check_signature(cls, operand_count: int, attrs: dict[str, Any]) -> dict[str, Any]:
        """Check operand count and attributes (names, presence, kinds); return them normalized.

        The verifier and the builder both call this, so an op is misused the same way everywhere.
        """
        lo, hi = cls.arity()
        if operand_count < lo or (hi is not None and operand_count > hi):
            want = f"{lo}" if lo == hi else f"at least {lo}"
            raise VerificationError(f"'{cls.name}' takes {want} operands, got {operand_count}")
        unknown = sorted(set(attrs) - set(cls.attributes))
        if unknown:
            known = ", ".join(cls.attributes) or "none"
            raise VerificationError(
                f"'{cls.name}' has no attribute(s) {', '.join(unknown)} (it has: {known})"
            )
        missing = [k for k, s in cls.attributes.items() if s.required and k not in attrs]
        if missing:
            raise VerificationError(f"'{cls.name}' is missing attribute(s) {', '.join(missing)}")
        normalized = {}
        for key, value in attrs.items():
            try:
                normalized[key] = cls.attributes[key].normalize(value)
            except TypeError as exc:
                raise VerificationError(f"'{cls.name}' attribute '{key}': {exc}") from None
        return normalized


OPS: dict[str, type[OpDef]] = {}


def register(cls: type[OpDef]) -> type[OpDef]:
    """Class decorator adding an op declaration to the registry (a duplicate name is a bug)."""
    if cls.name in OPS:
        raise TilefoldError(f"op {cls.name!r} is declared twice ({OPS[cls.name]} and {cls})")
    OPS[cls.name] = cls
    return cls
