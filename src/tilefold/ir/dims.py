"""Sums of symbolic dims: `?(s0+1)`, a KV cache one token longer than its past.

A symbolic dim is named by a symbol (`?s0`: its size comes from an argument's shape at run
time) or by an affine sum of symbols with integer coefficients, a *derived* dim, written in
one canonical form (terms sorted by symbol, the constant last: `s0+1`, `2*s0+s1-3`) so that
equal sums are equal dims. A derived dim's size is evaluated from its symbols' (`Bindings`).
Products of sizes are not dims (the frontend keeps `s0*s1` apart, `frontend/symbolic.py`).
"""

from __future__ import annotations

import re

from tilefold.errors import ShapeError

SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TERM = re.compile(r"([+-]?)(?:(\d+)\*)?([A-Za-z_][A-Za-z0-9_]*)|([+-]?)(\d+)")

Affine = tuple[dict[str, int], int]  # symbol -> coefficient (none 0), constant


def parse(text: str) -> Affine | None:
    """The terms and constant of `text` (`s0+1`, `-s0+2*s1`), or None if it is no sum."""
    terms: dict[str, int] = {}
    const, pos = 0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None or m.end() == pos or (pos and not (m.group(1) or m.group(4))):
            return None
        if m.group(3):
            coeff = int(m.group(2) or 1) * (-1 if m.group(1) == "-" else 1)
            terms[m.group(3)] = terms.get(m.group(3), 0) + coeff
        else:
            const += int(m.group(5)) * (-1 if m.group(4) == "-" else 1)
        pos = m.end()
    return ({s: c for s, c in terms.items() if c}, const) if text else None


def render(terms: dict[str, int], const: int) -> str:
    """The canonical text of a sum with at least one term."""
    parts = []
    for s in sorted(terms):
        c = terms[s]
        sign = "-" if c < 0 else "+" if parts else ""
        parts.append(f"{sign}{'' if abs(c) == 1 else f'{abs(c)}*'}{s}")
    if const:
        parts.append(f"{'-' if const < 0 else '+'}{abs(const)}")
    return "".join(parts)


def is_derived(name: str) -> bool:
    """Whether `name` is a canonical sum (not a plain symbol)."""
    found = None if SYMBOL.fullmatch(name) else parse(name)
    return found is not None and bool(found[0]) and render(*found) == name


def free_symbols(name: str) -> frozenset[str]:
    """The symbols a dim's size depends on (itself, for a plain symbol)."""
    found = parse(name) if is_derived(name) else None
    return frozenset(found[0]) if found else frozenset({name})


class Bindings(dict):
    """Sizes of symbolic dims by name; a derived dim's size is evaluated from its symbols on
    first lookup (a name no argument bound is a KeyError, as in a plain dict)."""

    def __missing__(self, name: str) -> int:
        if not is_derived(name):
            raise KeyError(name)
        terms, const = parse(name)  # type: ignore[misc]
        unbound = sorted(s for s in terms if not dict.__contains__(self, s))
        if unbound:
            raise KeyError(name)
        size = const + sum(c * dict.__getitem__(self, s) for s, c in terms.items())
        if size < 0:
            raise ShapeError(f"?({name}) is {size} here: a dim cannot be negative")
        self[name] = size
        return size

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
