"""Sharding strategies: each a class registered by name that turns a module, a mesh, a cost
model and constraints into a `Plan` (templates, propagation, an ILP search)."""

from tilefold.distributed.strategies import ilp, megatron, propagate  # noqa: F401 - registers
from tilefold.distributed.strategies.base import (
    STRATEGIES,
    Constraints,
    Strategy,
    StrategyError,
    get_strategy,
    plan_cost,
    register_strategy,
    search,
)
from tilefold.distributed.strategies.ilp import ILP
from tilefold.distributed.strategies.megatron import DataParallel, Megatron, MegatronSP
from tilefold.distributed.strategies.propagate import Propagate

__all__ = [
    "ILP",
    "STRATEGIES",
    "Constraints",
    "DataParallel",
    "Megatron",
    "MegatronSP",
    "Propagate",
    "Strategy",
    "StrategyError",
    "get_strategy",
    "plan_cost",
    "register_strategy",
    "search",
]
