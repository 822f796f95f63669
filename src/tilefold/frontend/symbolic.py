"""Sizes from PyTorch's symbolic shapes: symbols and their polynomials become `SymDim`s, the
rest stay sympy.

tilefold's IR names each dynamic size (`?s0`, or a name the user gives, `?batch`) and
polynomials of them with integer coefficients (`?(s0+1)`: a KV cache after one more token;
`?(s0*s1)`: a batch of sequences flattened into rows; `?(4*s0)`: a static dim folded into a
symbolic one; `ir/dims.py`). Any other size (a floor division, a max) is kept as a `Composite`
that only a few rules accept; where one is needed as a dim, `specialize` fixes its symbols to
the values the trace saw (a guard Dynamo checks on every call, tracing again when they
change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy
import torch

from tilefold.ir import dims
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
        self.env: Any = None  # PyTorch's ShapeEnv, from the first SymInt seen

    def specialize(self, value: Any) -> bool:
        """Fix every symbol of `value` to the size this trace saw, with a guard; whether any
        was still free (False: `value` is a constant already)."""
        expr = self.expr(value)
        if not expr.free_symbols or self.env is None:
            return False
        hints = self.env.backed_var_to_val
        for symbol in sorted(expr.free_symbols, key=str):
            real = next(s for s in hints if s.name == symbol.name)
            self.env.evaluate_expr(sympy.Eq(real, hints[real]))
        return True

    def size(self, value: Any) -> Size:
        """An int, a named SymDim or a Composite for an int, SymInt or sympy expression."""
        expr = sympy.expand(self.expr(value))
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            return SymDim(self.names.get(expr.name, expr.name))
        terms = expr.as_coefficients_dict()
        monomials = {t: self._monomial(t) for t in terms if t != 1}
        if all(c.is_Integer for c in terms.values()) and all(monomials.values()):
            named = {monomials[t]: int(c) for t, c in terms.items() if t != 1}
            return SymDim(dims.render(named, int(terms.get(sympy.S.One, 0))))
        return Composite(expr)

    def _monomial(self, term: Any) -> str | None:
        """The IR text of a product of symbols (`s0*s1`, `s0**2` -> `s0*s0`), else None."""
        factors = []
        for base, power in term.as_powers_dict().items():
            if not base.is_Symbol or not power.is_Integer or power < 1:
                return None
            factors += [self.names.get(base.name, base.name)] * int(power)
        return "*".join(sorted(factors))

    def expr(self, value: Any) -> Any:
        """A sympy expression over plain torch-named symbols."""
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            self.env = value.node.shape_env  # with the equalities it has learnt
            expr = self.env.replace(value.node.expr)
        elif isinstance(value, SymDim):
            terms, const = dims.parse(value.name) or ({value.name: 1}, 0)
            expr = sympy.Integer(const) + sum(
                (c * sympy.Mul(*(sympy.Symbol(self.inverse.get(s, s))
                                 for s in dims.symbols_of(m))) for m, c in terms.items()),
                sympy.Integer(0))
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
