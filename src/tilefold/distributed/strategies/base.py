"""The strategy interface: `search(module, mesh, cost, constraints) -> Plan`, a registry of
strategies by name, and the helpers every strategy shares (which arguments are data, what a
plan costs once applied)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from tilefold.distributed.blocks import LAYER_PREFIX
from tilefold.distributed.cost import AlphaBeta, CostModel, Estimate
from tilefold.distributed.plan import Plan, function
from tilefold.errors import TilefoldError
from tilefold.ir import Module
from tilefold.ir.core import Function, Value
from tilefold.ir.types import Mesh


class StrategyError(TilefoldError):
    """A strategy that is unknown, or cannot plan this module on this mesh."""


@dataclass(frozen=True)
class Constraints:
    """What a plan must satisfy and what it is judged on.

    memory_limit: bytes one device may hold (None: no limit).
    training:     judge a training step (forward, backward, gradient all_reduces), not forward.
    data:         the arguments that carry the batch (None: the function's first argument).
    share:        a regex whose match at the start of a value's name marks repeated layers:
                  values whose names differ only there share one decision (None: no sharing).
    pad:          a dim that does not split evenly over an axis may still be split, as a padded
                  shard S(d,pad) (blocks of ceil(size/n) rows); without it such splits are not
                  chosen.
    """

    memory_limit: int | None = None
    training: bool = False
    function: str = "main"
    data: tuple[str, ...] | None = None
    share: str | None = LAYER_PREFIX
    pad: bool = False

    def data_args(self, fn: Function) -> list[Value]:
        names = self.data if self.data is not None else (fn.args[0].name,) if fn.args else ()
        missing = set(names) - {a.name for a in fn.args}
        if missing:
            raise StrategyError(f"data arguments {sorted(missing)} are not arguments of "
                                f"@{fn.name}")
        return [a for a in fn.args if a.name in names]


class Strategy(ABC):
    """A way to choose a plan; subclasses are registered with `@register_strategy(name)`."""

    name: ClassVar[str] = ""

    @abstractmethod
    def search(self, module: Module, mesh: Mesh, cost: CostModel,
               constraints: Constraints) -> Plan:
        """A plan for `constraints.function` of `module` on `mesh`."""


STRATEGIES: dict[str, Callable[[], Strategy]] = {}


def register_strategy(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Decorator adding a strategy class under `name`; a second one by that name is an error."""

    def add(cls: type[Strategy]) -> type[Strategy]:
        if name in STRATEGIES:
            raise StrategyError(f"strategy '{name}' is registered already")
        cls.name = cls.name or name
        STRATEGIES[name] = cls
        return cls

    return add


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy '{name}'; known: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name]()


def search(module: Module, mesh: Mesh, strategy: str = "ilp", cost: CostModel | None = None,
           constraints: Constraints | None = None) -> Plan:
    """The plan strategy `strategy` finds (cost model: alpha-beta with default links)."""
    return get_strategy(strategy).search(module, mesh, cost or AlphaBeta(mesh),
                                         constraints or Constraints())


def plan_cost(plan: Plan, module: Module, cost: CostModel,
              constraints: Constraints | None = None) -> tuple[Module, Estimate]:
    """The partitioned module of `plan` and its modeled cost per device."""
    constraints = constraints or Constraints()
    partitioned = plan.apply(module)
    fn = function(partitioned, plan.function)
    return partitioned, cost.estimate(fn, training=constraints.training)
