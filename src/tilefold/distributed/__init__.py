"""Distributed programs: tensors placed on device meshes, collectives, and the simulated mesh
that gives every sharded program an oracle."""

from tilefold.distributed.simulate import SimulationError, join, run_ranks, simulate, split
from tilefold.ir.placements import ReplicaMismatchError, assemble, scatter
from tilefold.ir.types import Mesh, Partial, Replicate, Shard, Sharding

__all__ = [
    "Mesh",
    "Partial",
    "ReplicaMismatchError",
    "Replicate",
    "Shard",
    "Sharding",
    "SimulationError",
    "assemble",
    "join",
    "run_ranks",
    "scatter",
    "simulate",
    "split",
]
