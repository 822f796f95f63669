"""Propagation from user annotations (GSPMD-style): the placements written on a module's
arguments and on any of its results become the plan; propagate-sharding derives the rest."""

from __future__ import annotations

from tilefold.distributed.cost import CostModel
from tilefold.distributed.plan import Plan, function
from tilefold.distributed.strategies.base import (
    Constraints,
    Strategy,
    StrategyError,
    register_strategy,
)
from tilefold.ir import Module
from tilefold.ir.types import Mesh, Replicate


@register_strategy("propagate")
class Propagate(Strategy):
    """The annotated values keep their placements (unannotated arguments are replicated)."""

    def search(self, module: Module, mesh: Mesh, cost: CostModel,
               constraints: Constraints) -> Plan:
        fn = function(module, constraints.function)
        entries = []
        for v in fn.values():
            s = v.type.sharding
            if s is not None and s.mesh != mesh:
                raise StrategyError(f"%{v.name} is placed on {s.mesh.declaration()}, but the "
                                    f"plan is for {mesh.declaration()}")
            if s is not None:
                entries.append((v.name, s.placements))
            elif v in fn.args:
                entries.append((v.name, (Replicate(),) * len(mesh.axes)))
        return Plan(mesh, tuple(entries), "propagate", fn.name)
