"""dce: dead code elimination: erase pure ops whose results are never used."""

from __future__ import annotations

from tilefold.ir import Function
from tilefold.passes.base import Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter


@register_pass
class DCE(Pass):
    """Erase pure ops whose results are unused (never a terminator)."""

    statistics = (Statistic("num-erased", "ops erased"),)

    def run_on_function(self, fn: Function) -> None:
        # One backward sweep frees whole dead chains: an op's users come after it.
        self.count("num-erased", Rewriter(fn).erase_dead())
