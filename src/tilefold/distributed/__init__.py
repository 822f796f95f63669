"""Distributed programs: tensors placed on device meshes, collectives, the simulated mesh
that gives every sharded program an oracle, cost models, and the strategies that plan."""

from tilefold.distributed.blocks import BlockShape, gpt2, llama
from tilefold.distributed.cost import (
    DEVICES,
    LINKS,
    AlphaBeta,
    CostModel,
    CostModelError,
    DeviceSpec,
    Estimate,
    Item,
    Link,
    nbytes,
)
from tilefold.distributed.plan import Plan, PlanError, parse_mesh
from tilefold.distributed.propagate import PropagateSharding, explain
from tilefold.distributed.rules import RULES, Einsum, register_rule, rule_for
from tilefold.distributed.simulate import SimulationError, join, run_ranks, simulate, split
from tilefold.distributed.strategies import (
    STRATEGIES,
    Constraints,
    Strategy,
    StrategyError,
    get_strategy,
    plan_cost,
    register_strategy,
    search,
)
from tilefold.ir.placements import ReplicaMismatchError, assemble, scatter
from tilefold.ir.types import Mesh, Partial, Replicate, Shard, Sharding

__all__ = [
    "DEVICES",
    "LINKS",
    "RULES",
    "STRATEGIES",
    "AlphaBeta",
    "BlockShape",
    "Constraints",
    "CostModel",
    "CostModelError",
    "DeviceSpec",
    "Einsum",
    "Estimate",
    "Item",
    "Link",
    "Mesh",
    "Partial",
    "Plan",
    "PlanError",
    "PropagateSharding",
    "ReplicaMismatchError",
    "Replicate",
    "Shard",
    "Sharding",
    "SimulationError",
    "Strategy",
    "StrategyError",
    "assemble",
    "explain",
    "get_strategy",
    "gpt2",
    "join",
    "llama",
    "nbytes",
    "parse_mesh",
    "plan_cost",
    "register_rule",
    "register_strategy",
    "rule_for",
    "run_ranks",
    "scatter",
    "search",
    "simulate",
    "split",
]
