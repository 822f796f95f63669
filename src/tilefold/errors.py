"""The exception hierarchy: every user mistake surfaces as a `TilefoldError` subclass, and in
strict mode so does every failure a slower path would otherwise hide."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


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


class ArtifactError(TilefoldError):
    """An exported artifact cannot be written or cannot be trusted (not an artifact, another
    format version, a part missing, truncated or altered, a malformed step program); a host
    that cannot run it (another architecture, a CPU feature missing) is an `UnsupportedError`."""


class FallbackError(TilefoldError):
    """Strict mode: something failed and would have been replaced by a slower path (the next
    kernel method, the reference interpreter, PyTorch); the message names what and why."""


class WrongAnswerError(FallbackError):
    """Strict mode: a tuning candidate computed another answer than the reference (outside
    it, the candidate is passed over)."""


_STRICT: ContextVar[bool | None] = ContextVar("tilefold_strict", default=None)


def lookup(table: Mapping[str, T], name: str, what: str,
           error: type[TilefoldError] = TilefoldError) -> T:
    """`table[name]`, or `error` saying no `what` is called `name` and listing the names."""
    try:
        return table[name]
    except KeyError:
        raise error(f"no {what} named {name!r}; known: "
                    f"{', '.join(sorted(table)) or 'none'}") from None


def strict(flag: bool | None = None) -> bool:
    """Whether hidden fallbacks raise `FallbackError`: `flag` when given, else the flag of the
    innermost `strict_mode(flag)`, else `TILEFOLD_STRICT` (unset or 0: off)."""
    forced = _STRICT.get() if flag is None else flag
    if forced is not None:
        return bool(forced)
    return os.environ.get("TILEFOLD_STRICT", "").strip() not in ("", "0")


@contextlib.contextmanager
def strict_mode(flag: bool | None) -> Iterator[None]:
    """`strict()` answers `flag` inside the block; None leaves the answer as it was."""
    if flag is None:
        yield
        return
    token = _STRICT.set(bool(flag))
    try:
        yield
    finally:
        _STRICT.reset(token)
