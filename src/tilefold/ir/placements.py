"""What a placement means: a global array cut into per-rank blocks (`scatter`) and put back
together (`assemble`), over the ranks of a mesh numbered row-major by their coordinates.

A padded shard (`S(d,pad)`) cuts dim d in blocks of ceil(size/n) rows; the rows past the end
are padding, which holds unspecified values: here NaN for floats (so that a value leaking
from the padding shows) and zeros otherwise, and joining drops them again."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import ShapeError, TilefoldError
from tilefold.ir.ops.common import round_to, widen
from tilefold.ir.types import (
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    TensorType,
    level_shape,
)


class ReplicaMismatchError(TilefoldError):
    """Ranks that a replicated placement says hold one value hold different ones."""


def axis_groups(mesh: Mesh, axis: int) -> list[list[int]]:
    """The ranks that talk over mesh axis `axis`: those differing only in that coordinate, each
    group in coordinate order."""
    sizes = mesh.sizes
    others = [range(n) if a != axis else range(1) for a, n in enumerate(sizes)]
    groups = []
    for coord in itertools.product(*others):
        group = []
        for k in range(sizes[axis]):
            c = list(coord)
            c[axis] = k
            group.append(int(np.ravel_multi_index(c, sizes)) if sizes else 0)
        groups.append(group)
    return groups


def reduce_partials(blocks: list[np.ndarray], op: str) -> np.ndarray:
    """The value partial blocks stand for: their sum (computed wide, rounded once) or max."""
    dt = dtypes.dtype(blocks[0].dtype)
    if op == "max":
        return np.maximum.reduce([np.asarray(b) for b in blocks])
    with np.errstate(all="ignore"):
        return round_to(np.sum([widen(b) for b in blocks], axis=0), dt)


def padding_fill(dt: np.dtype) -> Any:
    """What the reference meaning writes in padding rows: NaN for floats, else zero."""
    return np.nan if np.issubdtype(dt, np.floating) else 0


def pad_to(x: np.ndarray, dim: int, size: int) -> np.ndarray:
    """`x` with padding rows (`padding_fill`) appended along `dim` up to `size` rows."""
    extra = size - x.shape[dim]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return np.concatenate([x, np.full(shape, padding_fill(x.dtype), x.dtype)], axis=dim)


def _split(x: np.ndarray, n: int, shard: Shard) -> list[np.ndarray]:
    dim = shard.dim
    if x.shape[dim] % n and not shard.pad:
        raise ShapeError(f"dim {dim} of a {list(x.shape)} block does not split evenly {n} ways "
                         f"(a padded shard S({dim},pad) would pad it)")
    x = pad_to(x, dim, -(-x.shape[dim] // n) * n)
    return [np.ascontiguousarray(b) for b in np.split(x, n, axis=dim)]


def unpad(x: np.ndarray, dim: int, size: int | None) -> np.ndarray:
    """`x` without the padding rows past `size` along `dim` (`size` None: none to drop)."""
    if size is None or x.shape[dim] == size:
        return x
    if x.shape[dim] < size:
        raise ShapeError(f"a {list(x.shape)} value has fewer than {size} rows along dim {dim}")
    return np.ascontiguousarray(np.take(x, np.arange(size), axis=dim))


def split_blocks(x: np.ndarray, n: int, placement: Placement,
                 rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """`x` as the `n` blocks the devices of one mesh axis hold under `placement`.

    A partial sum puts `x` on the first device and zeros elsewhere, or with `rng` random parts
    (floats only) that add up to it; a partial max puts `x` on one device and, with `rng`,
    smaller values on the others.
    """
    if isinstance(placement, Shard):
        return _split(x, n, placement)
    if isinstance(placement, Replicate) or n == 1:
        return [x] * n  # one array: replicas split alike further down (`scatter` copies)
    floating = dtypes.dtype(x.dtype).is_float
    if placement.op == "sum":
        if rng is None or not floating:
            return [x.copy()] + [np.zeros_like(x) for _ in range(n - 1)]
        parts = [round_to(rng.standard_normal(x.shape), dtypes.dtype(x.dtype))
                 for _ in range(n - 1)]
        rest = widen(x) - np.sum([widen(p) for p in parts], axis=0)
        return [*parts, round_to(rest, dtypes.dtype(x.dtype))]
    if rng is None or not floating:
        return [x.copy() for _ in range(n)]
    owner = int(rng.integers(n))
    lower = [round_to(widen(x) - np.abs(rng.standard_normal(x.shape)) - 1, dtypes.dtype(x.dtype))
             for _ in range(n)]
    return [x.copy() if k == owner else np.minimum(lower[k], x) for k in range(n)]


def join_blocks(blocks: list[np.ndarray], placement: Placement, check: bool = True,
                size: int | None = None) -> np.ndarray:
    """Inverse of `split_blocks`: concatenate shards (dropping the padding past `size` rows, the
    dim's size before the split, which a padded shard needs), reduce partials, take one
    replica (checking with `check` that all replicas agree bit for bit)."""
    if isinstance(placement, Shard):
        if placement.pad and size is None:
            raise ShapeError(f"joining the blocks of {placement} needs the dim's size")
        return unpad(np.concatenate(blocks, axis=placement.dim), placement.dim, size)
    if isinstance(placement, Partial):
        return reduce_partials(blocks, placement.op)
    if check:
        for k, b in enumerate(blocks[1:], 1):
            if b.shape != blocks[0].shape or b.tobytes() != blocks[0].tobytes():
                raise ReplicaMismatchError(
                    f"replicated value differs between the devices of one mesh axis (block {k} "
                    "is not block 0): a collective or op left the replicas apart")
    return blocks[0]


def scatter(x: np.ndarray, t: TensorType, rng: np.random.Generator | None = None
            ) -> list[np.ndarray]:
    """The per-rank blocks of global value `x` of sharded type `t`, in rank order."""
    if t.sharding is None:
        raise ShapeError(f"type {t} is not placed on a mesh; nothing to scatter")
    mesh = t.sharding.mesh
    grid = np.empty((), dtype=object)
    grid[()] = np.asarray(x)
    for n, placement in zip(mesh.sizes, t.sharding.placements, strict=True):
        bigger = np.empty((*grid.shape, n), dtype=object)
        done: dict[int, list[np.ndarray]] = {}  # replicas of one block get the same parts
        for index in np.ndindex(grid.shape):
            block = grid[index]
            if id(block) not in done:
                done[id(block)] = split_blocks(block, n, placement, rng)
            for k, part in enumerate(done[id(block)]):
                bigger[(*index, k)] = part
        grid = bigger
    return [np.array(grid[index], copy=True) for index in np.ndindex(grid.shape)]


def assemble(blocks: list[np.ndarray], t: TensorType, check: bool = True) -> np.ndarray:
    """The global value that per-rank `blocks` (rank order) of sharded type `t` stand for."""
    if t.sharding is None:
        raise ShapeError(f"type {t} is not placed on a mesh; nothing to assemble")
    mesh = t.sharding.mesh
    if len(blocks) != mesh.size:
        raise ShapeError(f"{len(blocks)} blocks for the {mesh.size} ranks of {mesh.declaration()}")
    grid = np.empty(mesh.sizes, dtype=object)
    for rank, index in enumerate(np.ndindex(mesh.sizes)):
        grid[index] = np.asarray(blocks[rank])
    for axis in reversed(range(len(mesh.axes))):
        placement = t.sharding.placements[axis]
        size = level_shape(t, axis)[placement.dim] if isinstance(placement, Shard) else None
        smaller = np.empty(grid.shape[:-1], dtype=object)
        for index in np.ndindex(smaller.shape):
            smaller[index] = join_blocks([grid[(*index, k)] for k in range(grid.shape[-1])],
                                         placement, check, size)  # type: ignore[arg-type]
        grid = smaller
    return grid[()]
