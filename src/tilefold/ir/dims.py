"""Polynomials of symbolic dims: `?(s0+1)`, a KV cache one token longer than its past, and
`?(s0*s1)`, a batch of sequences flattened into rows.

A symbolic dim is named by a symbol (`?s0`: its size comes from an argument's shape at run
time) or by a polynomial of symbols with integer coefficients, a *derived* dim: a sum of
terms, each a coefficient times a monomial (a product of symbols, `s0*s1`), and a constant.
It is written in one canonical form (a monomial's symbols sorted, the terms sorted by their
monomials' text, the constant last: `s0+1`, `2*s0+s1-3`, `s0*s1+s1`) so that equal
polynomials are equal dims. A derived dim's size is evaluated from its symbols' (`Bindings`).
Terms are keyed by their monomial's canonical text (`"s0"`, `"s0*s1"`), so sums add them up
as they add single symbols (`types.dim_sum`).
"""

from __future__ import annotations

import math
import re

from tilefold.errors import ShapeError

SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TERM = re.compile(rf"([+-]?)(?:(\d+)\*)?({_NAME}(?:\*{_NAME})*)|([+-]?)(\d+)")

# monomial (its symbols sorted, joined by `*`) -> coefficient (none 0), constant
Polynomial = tuple[dict[str, int], int]


def parse(text: str) -> Polynomial | None:
    """The terms and constant of `text` (`s0+1`, `-s0+2*s1`, `s1*s0-1`), or None if it is no
    polynomial."""
    terms: dict[str, int] = {}
    const, pos = 0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None or m.end() == pos or (pos and not (m.group(1) or m.group(4))):
            return None
        if m.group(3):
            coeff = int(m.group(2) or 1) * (-1 if m.group(1) == "-" else 1)
            monomial = "*".join(sorted(symbols_of(m.group(3))))
            terms[monomial] = terms.get(monomial, 0) + coeff
        else:
            const += int(m.group(5)) * (-1 if m.group(4) == "-" else 1)
        pos = m.end()
    return ({s: c for s, c in terms.items() if c}, const) if text else None


def render(terms: dict[str, int], const: int) -> str:
    """The canonical text of a polynomial with at least one term."""
    parts = []
    for s in sorted(terms):
        c = terms[s]
        sign = "-" if c < 0 else "+" if parts else ""
        parts.append(f"{sign}{'' if abs(c) == 1 else f'{abs(c)}*'}{s}")
    if const:
        parts.append(f"{'-' if const < 0 else '+'}{abs(const)}")
    return "".join(parts)


def symbols_of(monomial: str) -> list[str]:
    """The symbols a monomial multiplies, repeats included (`s0*s0*s1` -> s0, s0, s1)."""
    return monomial.split("*")


def is_derived(name: str) -> bool:
    """Whether `name` is a canonical polynomial (not a plain symbol)."""
    found = None if SYMBOL.fullmatch(name) else parse(name)
    return found is not None and bool(found[0]) and render(*found) == name


def free_symbols(name: str) -> frozenset[str]:
    """The symbols a dim's size depends on (itself, for a plain symbol)."""
    found = parse(name) if is_derived(name) else None
    return frozenset(s for m in found[0] for s in symbols_of(m)) if found else frozenset({name})


def least(name: str, smallest: int) -> int:
    """The least size dim `name` takes when every symbol is at least `smallest` (>= 0): the
    polynomial at that point where no coefficient nor the constant is negative (it grows with
    every symbol), else 0 (not known)."""
    if SYMBOL.fullmatch(name):
        return smallest
    found = parse(name)
    if found is None or min([*found[0].values(), found[1]]) < 0:
        return 0
    terms, const = found
    return sum(c * smallest ** len(symbols_of(m)) for m, c in terms.items()) + const


class Bindings(dict):
    """Sizes of symbolic dims by name; a derived dim's size is evaluated from its symbols on
    first lookup (a name no argument bound is a KeyError, as in a plain dict)."""

    def __missing__(self, name: str) -> int:
        size = self._evaluate(name)
        if size is None:
            raise KeyError(name)
        if size < 0:
            raise ShapeError(f"?({name}) is {size} here: a dim cannot be negative")
        self[name] = size
        return size

    def _evaluate(self, name: str) -> int | None:
        """A derived dim's size from its symbols' (None: not derived, or a symbol unbound)."""
        if not is_derived(name) or not all(dict.__contains__(self, s)
                                           for s in free_symbols(name)):
            return None
        terms, const = parse(name)  # type: ignore[misc]
        return const + sum(c * math.prod(dict.__getitem__(self, s) for s in symbols_of(m))
                           for m, c in terms.items())

    def check(self, where: str) -> None:
        """Raise ShapeError if a derived dim bound to a size of its own (an argument's dim,
        bound before its symbols were) disagrees with its symbols' sizes."""
        for name, size in list(self.items()):
            want = self._evaluate(name)
            if want is not None and want != size:
                symbols = ", ".join(f"?{s} = {dict.__getitem__(self, s)}"
                                    for s in sorted(free_symbols(name)))
                raise ShapeError(f"{where}: ?({name}) is {size}, but {symbols} make it {want}")

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def get(self, name: str, default=None):  # type: ignore[override]
        try:
            return self[name]
        except KeyError:
            return default

    def bind(self, name: str, size: int) -> int:
        """Bind `name` to `size` unless it already has a size; return the size it has now."""
        if name not in self:
            self[name] = size
        return self[name]
