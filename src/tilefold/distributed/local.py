"""Per-rank meanings of the ops whose work on a block differs from their global reference:
attributes that name global sizes (reshape) and lookups into a split table (gather)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefold.errors import ShapeError
from tilefold.ir.core import Operation
from tilefold.ir.placements import axis_groups
from tilefold.ir.shapes import normalize_axis
from tilefold.ir.types import Mesh, Shard, TensorType, local_shape

# (op, mesh, rank, the rank's operand blocks, attributes) -> the rank's result block
Local = Callable[[Operation, Mesh, int, list[np.ndarray], dict[str, Any]], np.ndarray]
LOCAL: dict[str, Local] = {}


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


def reshape(op: Operation, mesh: Mesh, rank: int, blocks: list[np.ndarray],
            attrs: dict[str, Any]) -> np.ndarray:
    return np.reshape(blocks[0], local_shape(op.result.type))


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


LOCAL.update(reshape=reshape, gather=gather)
