"""Structural comparison of IR: same functions, ops, types and attributes, whatever the value names.

IR objects have no `__eq__` (passes keep them in dicts and sets by identity); tests and passes
compare graphs with `structurally_equal` instead, or `first_difference` to say where they differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tilefold.ir.core import Block, Function, Module, Operation, Value


def structurally_equal(a: Module | Function, b: Module | Function, names: bool = False) -> bool:
    """Whether `a` and `b` are the same graph; `names=True` also compares value names and locs."""
    return first_difference(a, b, names) is None


def first_difference(a: Module | Function, b: Module | Function, names: bool = False) -> str | None:
    """A sentence naming the first place where `a` and `b` differ, or None if they do not."""
    if isinstance(a, Module) and isinstance(b, Module):
        if names and a.name != b.name:
            return f"module names differ: {a.name} vs {b.name}"
        if a.meshes != b.meshes:
            return (f"meshes differ: {sorted(m.declaration() for m in a.meshes.values())} vs "
                    f"{sorted(m.declaration() for m in b.meshes.values())}")
        if list(a.functions) != list(b.functions):
            return f"functions differ: {list(a.functions)} vs {list(b.functions)}"
        for fa, fb in zip(a.functions.values(), b.functions.values(), strict=True):
            found = first_difference(fa, fb, names)
            if found:
                return found
        return None
    if isinstance(a, Function) and isinstance(b, Function):
        return _Matcher(names).function(a, b)
    return f"cannot compare {type(a).__name__} with {type(b).__name__}"


class _Matcher:
    """Walks two graphs in step, pairing each value of the first with one of the second."""

    def __init__(self, names: bool):
        self.names = names
        self.pairs: dict[Value, Value] = {}

    def function(self, a: Function, b: Function) -> str | None:
        where = f"@{a.name}"
        if a.name != b.name:
            return f"function names differ: @{a.name} vs @{b.name}"
        if a.result_types != b.result_types:
            return f"{where}: result types differ"
        if self.names and a.loc != b.loc:
            return f"{where}: locations differ: {a.loc} vs {b.loc}"
        return self.block(a.body, b.body, where)

    def bind(self, xs: list[Value], ys: list[Value], where: str) -> str | None:
        if len(xs) != len(ys):
            return f"{where}: {len(xs)} vs {len(ys)} values"
        for x, y in zip(xs, ys, strict=True):
            if x.type != y.type:
                return f"{where}: %{x.name} is {x.type} but %{y.name} is {y.type}"
            if self.names and x.name != y.name:
                return f"{where}: value names differ: %{x.name} vs %{y.name}"
            self.pairs[x] = y
        return None

    def block(self, a: Block, b: Block, where: str) -> str | None:
        found = self.bind(a.args, b.args, f"{where} arguments")
        if found:
            return found
        return _first_difference(a.ops, b.ops, f"{where}: {{}} vs {{}} ops",
                                 lambda i, x, y: self.op(x, y, f"{where} op {i} ({x.name})"))

    def op(self, a: Operation, b: Operation, where: str) -> str | None:
        if a.opdef is not b.opdef:
            return f"{where}: '{a.name}' vs '{b.name}'"
        if [self.pairs.get(v) for v in a.operands] != b.operands:
            return f"{where}: operands differ"
        attrs_a, attrs_b = a.opdef.full_attrs(a.attrs), b.opdef.full_attrs(b.attrs)
        if attrs_a.keys() != attrs_b.keys():
            return f"{where}: attribute names differ"
        for key in attrs_a:
            if not _same_attr(attrs_a[key], attrs_b[key]):
                return f"{where}: attribute '{key}' differs"
        if self.names and a.loc != b.loc:
            return f"{where}: locations differ: {a.loc} vs {b.loc}"
        found = _first_difference(a.regions, b.regions, f"{where}: {{}} vs {{}} regions",
                                  lambda k, x, y: self.block(x, y, f"{where} region {k}"))
        return found or self.bind(a.results, b.results, f"{where} results")


def _first_difference(xs: Sequence, ys: Sequence, count_differs: str,
                      compare: Callable[[int, Any, Any], str | None]) -> str | None:
    """Where two lists first differ: their lengths (`count_differs` formatted with both), or
    the first pair `compare` (index, x, y) finds a difference in."""
    if len(xs) != len(ys):
        return count_differs.format(len(xs), len(ys))
    return next((found for i, (x, y) in enumerate(zip(xs, ys, strict=True))
                 if (found := compare(i, x, y))), None)


def _same_attr(x: Any, y: Any) -> bool:
    """Equal attribute values; arrays and floats bit for bit (NaN equals NaN, -0.0 is not 0.0)."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return (
            isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)
            and x.dtype == y.dtype
            and x.shape == y.shape
            and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
        )
    if isinstance(x, float) and isinstance(y, float):
        return np.float64(x).tobytes() == np.float64(y).tobytes()
    return type(x) is type(y) and x == y
