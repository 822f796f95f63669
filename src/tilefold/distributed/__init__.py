"""Distributed programs: tensors placed on device meshes, collectives, and the simulated mesh
that gives every sharded program an oracle."""

from tilefold.distributed.local import PlacementError, local_attrs, local_type
from tilefold.distributed.partition import PartitionError, SpmdPartition
from tilefold.distributed.propagate import PropagateSharding, explain
from tilefold.distributed.rules import RULES, Einsum, register_rule, rule_for
from tilefold.distributed.simulate import SimulationError, join, run_ranks, simulate, split
from tilefold.distributed.torchrun import RUNNERS, ExecutorError, RankProgram, runner
from tilefold.ir.placements import ReplicaMismatchError, assemble, scatter
from tilefold.ir.types import Mesh, Partial, Replicate, Shard, Sharding

__all__ = [
    "RULES",
    "RUNNERS",
    "Einsum",
    "ExecutorError",
    "Mesh",
    "Partial",
    "PartitionError",
    "PlacementError",
    "PropagateSharding",
    "RankProgram",
    "ReplicaMismatchError",
    "Replicate",
    "Shard",
    "Sharding",
    "SimulationError",
    "SpmdPartition",
    "assemble",
    "explain",
    "join",
    "local_attrs",
    "local_type",
    "register_rule",
    "rule_for",
    "run_ranks",
    "runner",
    "scatter",
    "simulate",
    "split",
]
