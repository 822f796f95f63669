"""The pass and pipeline registries that `-p` looks names up in."""

from __future__ import annotations

import difflib
import re

from tilefold.errors import PassError
from tilefold.passes.base import Pass
from tilefold.passes.canonicalize import Canonicalize
from tilefold.passes.constant_fold import ConstantFold
from tilefold.passes.cse import CSE
from tilefold.passes.dce import DCE
from tilefold.passes.expand_redistribute import ExpandRedistribute
from tilefold.passes.merge_matmuls import MergeMatmuls
from tilefold.passes.shape_inference import ShapeInference

PASSES: dict[str, type[Pass]] = {
    cls.name: cls
    for cls in (
        Canonicalize, CSE, DCE, ConstantFold, ShapeInference, MergeMatmuls, ExpandRedistribute
    )
}

# Named pipelines: a name that stands for a pipeline text wherever a pass name may appear.
PIPELINES: dict[str, str] = {
    "default": "canonicalize,cse,constant-fold,dce",
}

_NAME = re.compile(r"[a-z][a-z0-9-]*")


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator making a pass available to pipelines; a name taken twice is an error."""
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
