"""Sizes from PyTorch's symbolic shapes: plain symbols become `SymDim`s, the rest stay sympy.

tilefold's IR names each dynamic size (`?s0`, or a name the user gives, `?batch`); it has no
products of sizes. A size such as `s0*s1` (a flattened batch x sequence) is kept as a
`Composite` that only a few rules accept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy
import torch

from tilefold.ir.types import SymDim


@dataclass(frozen=True)
class Composite:
    """A size that is an expression of several symbols, e.g. `s0*s1`."""

    expr: Any

    def __str__(self) -> str:
        return str(self.expr)


Size = int | SymDim | Composite


class Sizes:
    """Translates sizes between PyTorch's symbols and IR dims, with optional friendly names."""

    def __init__(self, names: dict[str, str] | None = None):
        self.names = dict(names or {})  # torch symbol name -> IR dim name
        self.inverse = {v: k for k, v in self.names.items()}

    def size(self, value: Any) -> Size:
        """An int, a named SymDim or a Composite for an int, SymInt or sympy expression."""
        expr = self.expr(value)
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            return SymDim(self.names.get(expr.name, expr.name))
        return Composite(expr)

    def expr(self, value: Any) -> Any:
        """A sympy expression over plain torch-named symbols."""
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
        elif isinstance(value, SymDim):
            expr = sympy.Symbol(self.inverse.get(value.name, value.name))
        elif isinstance(value, Composite):
            expr = value.expr
        elif isinstance(value, sympy.Basic):
            expr = value
        else:
            return sympy.Integer(int(value))
        return expr.subs({s: sympy.Symbol(s.name) for s in expr.free_symbols})

    def same(self, a: Any, b: Any) -> bool:
        """Whether two sizes are provably equal."""
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return sympy.expand(self.expr(a) - self.expr(b)) == 0

    def product(self, sizes: Any) -> Any:
        return sympy.Mul(*(self.expr(s) for s in sizes))
