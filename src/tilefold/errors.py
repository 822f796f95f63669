"""The exception hierarchy: every user mistake surfaces as a `TilefoldError` subclass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """A point in a source text (1-based line and column), used by diagnostics and the IR."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class TilefoldError(Exception):
    """Base of all errors tilefold raises on purpose; the message says what to do."""

    def __init__(self, message: str, loc: Location | None = None, source: str | None = None):
        self.message = message
        self.loc = loc
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        if self.loc is None:
            return self.message
        text = f"{self.loc}: error: {self.message}"
        if self.source is not None:
            lines = self.source.splitlines()
            if 1 <= self.loc.line <= len(lines):
                line = lines[self.loc.line - 1]
                text += f"\n{line}\n{' ' * (self.loc.col - 1)}^"
        return text


class ParseError(TilefoldError):
    """The IR text is malformed."""


class VerificationError(TilefoldError):
    """The IR is well-formed text but breaks a rule (types, SSA, op constraints)."""


class ShapeError(TilefoldError):
    """Operand shapes do not fit the op (mismatch, broadcasting, bad axes)."""


class DTypeError(TilefoldError):
    """Operand dtypes do not fit the op, or no kernel exists for the combination."""


class UnsupportedError(TilefoldError):
    """A feature, op or target that tilefold does not handle (yet)."""


class PassError(TilefoldError):
    """A pass pipeline is malformed or a pass failed."""


class CompileError(TilefoldError):
    """Code generation or LLVM compilation failed."""


class CacheError(TilefoldError):
    """An on-disk cache or tuning database cannot be used."""
