"""Distributed programs: tensors placed on device meshes, collectives, the per-rank programs
they partition into, cost models and the strategies that plan, and the runtimes (the simulated
mesh, every sharded program's oracle, and the torchrun executor)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tilefold.distributed.blocks import BlockShape, gpt2, llama
from tilefold.distributed.bucketing import BucketAllReduces
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
from tilefold.distributed.local import PlacementError, local_attrs, local_type
from tilefold.distributed.merge_partials import MergePartials
from tilefold.distributed.partition import PartitionError, SpmdPartition
from tilefold.distributed.per_rank import bind_rank
from tilefold.distributed.plan import Plan, PlanError, parse_mesh
from tilefold.distributed.propagate import PropagateSharding, explain
from tilefold.distributed.rules import RULES, Einsum, register_rule, rule_for
from tilefold.distributed.simulate import SimulationError, join, run_ranks, simulate, split
from tilefold.distributed.split_all_reduce import SplitAllReduce
from tilefold.distributed.strategies import STRATEGIES, Constraints, Strategy, plan_cost, search
from tilefold.distributed.torchrun import RUNNERS, ExecutorError, RankProgram, runner
from tilefold.ir.placements import ReplicaMismatchError, assemble, scatter
from tilefold.ir.types import Mesh, Partial, Replicate, Shard, Sharding
from tilefold.passes.pipeline import register_pipeline

# collective optimization of a placed program (after expand-redistribute, before spmd-partition);
# bucket-all-reduces runs on the per-rank program after spmd-partition
register_pipeline("optimize-collectives", "merge-partials,split-all-reduce")

if TYPE_CHECKING:
    import torch

    from tilefold.distributed.parallelize import ParallelModel


def parallelize(model: torch.nn.Module, mesh: Mesh | Mapping[str, int],
                example_inputs: Sequence[torch.Tensor],
                strategy: str | Mapping[str, str] = "dp", **options: Any) -> ParallelModel:
    """An nn.Module's forward partitioned over `mesh` for a torch.distributed job (needs
    PyTorch): a strategy of `STRATEGIES`, or placements per parameter or input name; the
    options are `tilefold.distributed.parallelize.parallelize`'s."""
    from tilefold.distributed.parallelize import parallelize as build

    return build(model, mesh, example_inputs, strategy, **options)


__all__ = [
    "DEVICES",
    "LINKS",
    "RULES",
    "RUNNERS",
    "STRATEGIES",
    "AlphaBeta",
    "BlockShape",
    "BucketAllReduces",
    "Constraints",
    "CostModel",
    "CostModelError",
    "DeviceSpec",
    "Einsum",
    "Estimate",
    "ExecutorError",
    "Item",
    "Link",
    "MergePartials",
    "Mesh",
    "Partial",
    "PartitionError",
    "PlacementError",
    "Plan",
    "PlanError",
    "PropagateSharding",
    "RankProgram",
    "ReplicaMismatchError",
    "Replicate",
    "Shard",
    "Sharding",
    "SimulationError",
    "SplitAllReduce",
    "SpmdPartition",
    "Strategy",
    "assemble",
    "bind_rank",
    "explain",
    "gpt2",
    "join",
    "llama",
    "local_attrs",
    "local_type",
    "nbytes",
    "parallelize",
    "parse_mesh",
    "plan_cost",
    "register_rule",
    "rule_for",
    "run_ranks",
    "runner",
    "scatter",
    "search",
    "simulate",
    "split",
]
