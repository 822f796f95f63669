"""Per-rank meanings of the ops whose work on a block is not their reference on that block
(with local attributes, `local.py`): lookups into a split table (gather)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefold.errors import ShapeError
from tilefold.ir.core import Operation
from tilefold.ir.placements import axis_groups
from tilefold.ir.shapes import normalize_axis
from tilefold.ir.types import Mesh, Shard, TensorType

# (op, mesh, rank, the rank's operand blocks, attributes) -> the rank's result block
PerRank = Callable[[Operation, Mesh, int, list[np.ndarray], dict[str, Any]], np.ndarray]
PER_RANK: dict[str, PerRank] = {}


def block_start(t: TensorType, rank: int, dim: int) -> int:
    """Where along `dim` the block of sharded type `t` that `rank` holds begins."""
    mesh = t.sharding.mesh
    size, start = t.shape[dim], 0
    for axis, (n, p) in enumerate(zip(mesh.sizes, t.sharding.placements, strict=True)):
        if p == Shard(dim):
            coord = next(g.index(rank) for g in axis_groups(mesh, axis) if rank in g)
            size //= n
            start += coord * size
    return start


def gather(op: Operation, mesh: Mesh, rank: int, blocks: list[np.ndarray],
           attrs: dict[str, Any]) -> np.ndarray:
    """Rows this rank holds are looked up; the others give zeros (the result is P(sum))."""
    table, ids = blocks[0], blocks[1].astype(np.int64)
    t = op.operands[0].type
    axis = normalize_axis("gather", attrs["axis"], t.rank)
    size = t.shape[axis]
    if ids.size and (ids.min() < -size or ids.max() >= size):
        raise ShapeError(f"gather: index out of range [{-size}, {size}) for axis {axis} of "
                         f"{t} (got {ids.min()}..{ids.max()})")
    ids = np.where(ids < 0, ids + size, ids) - (block_start(t, rank, axis) if t.sharding else 0)
    held = (ids >= 0) & (ids < table.shape[axis])
    rows = np.take(table, np.where(held, ids, 0), axis=axis)
    keep = held.reshape((1,) * axis + held.shape + (1,) * (t.rank - axis - 1))
    return np.where(keep, rows, np.zeros((), table.dtype))


PER_RANK.update(gather=gather)


def differs_on_blocks(op: Operation) -> bool:
    """Whether `op` as placed needs its per-rank meaning (its reference on the blocks would be
    wrong): a gather whose table is split along the looked-up dim."""
    if op.name != "gather" or op.operands[0].type.sharding is None:
        return False
    t = op.operands[0].type
    axis = normalize_axis("gather", op.attr("axis"), t.rank)
    return Shard(axis) in t.sharding.placements
