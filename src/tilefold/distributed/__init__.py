"""Distributed programs: tensors placed on device meshes, collectives, and the simulated mesh
that gives every sharded program an oracle."""

from tilefold.distributed.propagate import PropagateSharding, explain
from tilefold.distributed.rules import RULES, Einsum, register_rule, rule_for
from tilefold.distributed.simulate import SimulationError, join, run_ranks, simulate, split
from tilefold.ir.placements import ReplicaMismatchError, assemble, scatter
from tilefold.ir.types import Mesh, Partial, Replicate, Shard, Sharding

__all__ = [
    "RULES",
    "Einsum",
    "Mesh",
    "Partial",
    "PropagateSharding",
    "ReplicaMismatchError",
    "Replicate",
    "Shard",
    "Sharding",
    "SimulationError",
    "assemble",
    "explain",
    "join",
    "register_rule",
    "rule_for",
    "run_ranks",
    "scatter",
    "simulate",
    "split",
]
