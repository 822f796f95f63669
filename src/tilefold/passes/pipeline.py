"""The textual pipeline syntax, MLIR's: passes separated by commas, options in braces.

    pipeline := element (',' element)*
    element  := name | name '{' option (' ' option)* '}'
    option   := key '=' value

    canonicalize,cse,dce
    canonicalize{max-iterations=3 strict-signed-zeros=true},dce
    shape-inference{bind=batch=8,seq=128},default

A value runs to the next space or '}', so list values use commas (`bind=batch=8,seq=128`).
A name may also be a named pipeline (`default`), which expands in place; it takes no options.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from tilefold.errors import PassError
from tilefold.passes.base import Pass
from tilefold.passes.registry import PASSES, PIPELINES, check_name, suggest

_ELEMENT = re.compile(r"\s*(?P<name>[A-Za-z0-9_-]+)\s*(?:\{(?P<options>[^{}]*)\})?\s*(?:,|$)")


def parse_pipeline(text: str) -> list[Pass]:
    """The passes `text` names, in order, each configured with its options."""
    return _parse(text, ())


def _parse(text: str, expanding: tuple[str, ...]) -> list[Pass]:
    passes: list[Pass] = []
    pos = 0
    while pos < len(text.rstrip()):
        m = _ELEMENT.match(text, pos)
        if m is None:
            raise _error(text, pos, "expected a pass name, optionally with {options}")
        name, options = m.group("name"), m.group("options")
        if name in PIPELINES:
            if options is not None:
                raise _error(text, m.start("options"), f"pipeline '{name}' takes no options")
            if name in expanding:
                raise _error(text, m.start("name"), f"pipeline '{name}' refers to itself")
            passes += _parse(PIPELINES[name], (*expanding, name))
        elif name in PASSES:
            try:
                passes.append(PASSES[name].from_text(_options(options or "")))
            except PassError as exc:
                raise _error(text, m.start("options"), exc.message) from None
        else:
            raise _error(text, m.start("name"), f"unknown pass '{name}'{suggest(name)}")
        pos = m.end()
        if text[m.start() : pos].endswith(",") and not text[pos:].strip():
            raise _error(text, pos, "expected a pass name after ','")
    return passes


def key_values(items: Iterable[str], malformed: Callable[[str], Exception],
               repeated: Callable[[str, str, str], Exception], prefix: str = "") -> dict[str, str]:
    """`key=value` texts as a dict, each key once (keys may start with `prefix`, dropped):
    `malformed(item)` and `repeated(key, first value, second)` make the errors."""
    pairs: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().removeprefix(prefix) if prefix else key
        if not eq or not key:
            raise malformed(item)
        if key in pairs:
            raise repeated(key, pairs[key], value)
        pairs[key] = value
    return pairs


def _options(text: str) -> dict[str, str]:
    return key_values(text.split(),
                      lambda item: PassError(f"option '{item}' must be written key=value"),
                      lambda key, _, __: PassError(f"option '{key}' is given twice"))


def _error(text: str, pos: int, message: str) -> PassError:
    return PassError(f"{message}\n  in pipeline: {text}\n{' ' * (15 + pos)}^")


def register_pipeline(name: str, text: str) -> None:
    """Name a pipeline text (`cleanup` -> `canonicalize,dce`) for use in other pipelines."""
    check_name(name)
    parse_pipeline(text)  # a bad pipeline fails here, not where it is used
    PIPELINES[name] = text
