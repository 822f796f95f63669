"""The ATen lowering registry: one rule per ATen overload, keyed by the overload, with a context.

A rule is `fn(ctx, *args, **kwargs)` called with the FX node's own arguments. It builds IR through
`ctx` and returns the node's value (a `Tensor`, a list for several results, a dim, or None). When
it cannot lower this particular call (a dropout probability, an unsupported dtype) it raises
`NotApplicable` with a reason; the caller then runs that node with PyTorch (torch.compile) or
reports it (torch.export). Where only symbolic sizes stand in the way, it specializes them
(`Specialized`) and the graph is converted again with them fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tilefold.errors import TilefoldError


class NotApplicable(Exception):
    """A rule does not apply to this call; `reason` says why (shown by explain)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Specialized(Exception):
    """A rule fixed symbolic sizes to the values this trace saw (the IR cannot express what it
    needs of them: a product or floor division of sizes, a number an attribute must hold).
    The guards that added make Dynamo trace again for other values; the conversion starts over,
    seeing those sizes as constants everywhere."""


@dataclass(frozen=True)
class Rule:
    """How one ATen overload becomes tilefold IR."""

    target: Any  # a torch OpOverload, a Python callable such as operator.getitem, or the
    # name of an overload that exists only once some part of PyTorch is imported (`prims.fma`,
    # which Dynamo's `lerp` brings in with Inductor's prims): matched by `str(overload)`
    fn: Callable[..., Any]
    summary: str
    whole: bool = False  # kept out of PyTorch's decomposition: the rule lowers it in one piece


RULES: dict[Any, Rule] = {}


def lowering(*targets: Any, summary: str = "", whole: bool = False
             ) -> Callable[[Callable], Callable]:
    """Decorator registering `fn` as the rule for each of `targets`; a second rule is a bug.
    `whole`: PyTorch must not decompose the targets first (the rule maps each to one IR op,
    smaller IR and what the fused kernels want)."""

    def add(fn: Callable) -> Callable:
        for target in targets:
            if target in RULES:
                raise TilefoldError(f"two lowering rules for {target}: {RULES[target].fn} and {fn}")
            RULES[target] = Rule(target, fn, summary or (fn.__doc__ or "").strip(), whole)
        return fn

    return add


def rule_for(target: Any) -> Rule | None:
    rule = RULES.get(target)
    if rule is None and hasattr(target, "_schema"):  # an OpOverload a rule names as text
        rule = RULES.get(str(target))
    return rule
