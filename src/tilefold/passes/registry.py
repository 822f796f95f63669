"""The pass and pipeline registries that `-p` looks names up in.

Each pass registers itself with `@register_pass` in its own file; the package (`passes/__init__.py`)
imports every pass file, so the table is complete whenever `tilefold.passes` is imported.
"""

from __future__ import annotations

import difflib
import re

from tilefold.errors import PassError
from tilefold.passes.base import Pass

PASSES: dict[str, type[Pass]] = {}

# Named pipelines: a name that stands for a pipeline text wherever a pass name may appear.
PIPELINES: dict[str, str] = {
    "default": "canonicalize,cse,constant-fold,dce",
}

_NAME = re.compile(r"[a-z][a-z0-9-]*")


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator making a pass available to pipelines; a name taken twice is an error.

    Unless the class sets them, its pipeline name is its own in lowercase words joined by '-'
    (`MergeMatmuls` -> `merge-matmuls`, `CSE` -> `cse`) and its summary the first line of its
    docstring."""
    if "name" not in vars(cls):
        cls.name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-",
                          cls.__name__).lower()
    if "summary" not in vars(cls):
        if not cls.__doc__:
            raise PassError(f"pass {cls.__name__} needs a docstring (its summary) or a summary")
        cls.summary = cls.__doc__.strip().splitlines()[0].removesuffix(".")
    check_name(cls.name)
    PASSES[cls.name] = cls
    return cls


def check_name(name: str) -> None:
    """A new pass or pipeline name must be well-formed and not taken."""
    if not _NAME.fullmatch(name):
        raise PassError(f"pass name {name!r} must be lowercase words joined by '-'")
    if name in PASSES or name in PIPELINES:
        raise PassError(f"a pass or pipeline named '{name}' is registered already")


def suggest(name: str) -> str:
    """A ' (did you mean ...?)' hint for a misspelled pass or pipeline name."""
    close = difflib.get_close_matches(name, [*PASSES, *PIPELINES], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
