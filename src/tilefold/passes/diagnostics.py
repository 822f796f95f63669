"""`--verify-diagnostics`: check the errors a test file expects against the one it produces.

A comment `// expected-error @+1 {{substring}}` expects an error whose message contains
`substring` on the line after it (`@-1`/`@above`, `@below`, `@+N`, or no offset for the same
line; `@unknown` for an error without a location). The parser and verifier stop at the first
error, so each `// -----` chunk of a test file can expect one error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tilefold.errors import TilefoldError

_EXPECTED = re.compile(
    r"//\s*expected-error\s*(?:@(?P<at>[+-]\d+|above|below|unknown))?\s*\{\{(?P<text>.*?)\}\}"
)
_OFFSETS = {"above": -1, "below": 1, None: 0}


@dataclass(frozen=True)
class Expected:
    """An expected error: its message substring and line (None: an error without location)."""

    line: int | None
    text: str
    written_at: int


def expected_errors(text: str) -> list[Expected]:
    """Every `expected-error` comment in `text`, with the line it points at."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for m in _EXPECTED.finditer(line):
            found.append(Expected(_target(m.group("at"), number), m.group("text"), number))
    return found


def _target(at: str | None, line: int) -> int | None:
    if at == "unknown":
        return None
    return line + (_OFFSETS[at] if at in _OFFSETS else int(at))


def check(file: str, expected: list[Expected], error: TilefoldError | None) -> list[str]:
    """Messages for every mismatch between the expected errors and the one produced."""
    problems = []
    matched = None
    if error is not None:
        line = error.loc.line if error.loc is not None else None
        matched = next((e for e in expected if e.line == line and e.text in error.message), None)
        if matched is None:
            problems.append(f"unexpected error: {error}")
    for e in expected:
        if e is not matched:
            where = f"line {e.line}" if e.line is not None else "an unknown location"
            problems.append(
                f"{file}:{e.written_at}: error: expected error at {where} containing "
                f'"{e.text}" was not produced'
            )
    return problems
