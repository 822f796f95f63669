"""Padded shards on blocks: which operand rows an op must mask so that padding never reaches a
reduction, and how many rows of a rank's block are real, in NumPy (the simulated mesh) and as
the per-rank ops spmd-partition writes.

A padded shard `S(d,pad)` leaves unspecified values in the padding rows (an elementwise op
makes f(pad) of them). An op whose rule reduces over a padded dim (matmul's contraction,
reduce_sum, reduce_max, ...: the letter's placement becomes P(sum) or P(max)) first replaces
the padding of each operand on that dim with the reduction's identity, zeros for a sum and
-inf for a max, so the partial values are exact:

    %p = matmul(%h, %w2) : f32[4,8] @m[P(sum)]         h: f32[4,30] @m[S(1,pad)] on tp=4
      -> per rank: where(arange(8) < 30 - 8 * spmd.axis_index("tp"), h, 0), the same for w2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.distributed.per_rank import coordinate
from tilefold.distributed.rules import rule_for
from tilefold.ir.core import Operation, Value
from tilefold.ir.types import Mesh, Shard, TensorType, level_shape, local_shape
from tilefold.passes.rewrite import Rewriter

# A padded level of one dim: the rows the axis cuts (`extent`) and, for it and each later axis
# cutting the dim, (mesh axis, rows per block); row i of a rank's block is real when
# i + sum(coordinate * rows) < extent for every padded level.
Level = tuple[int, list[tuple[int, int]]]


def padding_levels(t: TensorType, dim: int) -> list[Level]:
    """The levels of `dim` of sharded type `t` that hold padding (a padded shard that does not
    split its rows evenly), outermost first."""
    if t.sharding is None:
        return []
    cuts = [(axis, n, p) for axis, (n, p) in enumerate(zip(t.sharding.mesh.sizes,
                                                             t.sharding.placements, strict=True))
            if isinstance(p, Shard) and p.dim == dim]
    steps = [(axis, level_shape(t, axis + 1)[dim]) for axis, _, _ in cuts]
    levels = []
    for k, (axis, n, p) in enumerate(cuts):
        extent = level_shape(t, axis)[dim]
        if p.pad and isinstance(extent, int) and extent % n:
            levels.append((extent, steps[k:]))
    return levels  # type: ignore[return-value]


def real_rows(t: TensorType, dim: int, mesh: Mesh, rank: int) -> int:
    """How many leading rows along `dim` of `rank`'s block of `t` are real (not padding)."""
    rows = local_shape(t)[dim]
    for extent, steps in padding_levels(t, dim):
        start = sum(coordinate(mesh, rank, axis) * step for axis, step in steps)
        rows = min(rows, max(extent - start, 0))
    return rows  # type: ignore[return-value]


@dataclass(frozen=True)
class Mask:
    """Operand `index` of an op has padding along `dim` to overwrite with `fill` first."""

    index: int
    dim: int
    fill: str  # "sum" (zeros) or "max" (-inf)


def masks(op: Operation) -> list[Mask]:
    """The operand dims whose padding `op` must mask: those its rule reduces over (the letter
    is missing from the result and its shard becomes a partial)."""
    einsum = rule_for(op)
    if einsum is None or not op.operands:
        return []
    found = []
    for index, (v, letters) in enumerate(zip(op.operands, einsum.inputs, strict=True)):
        if v.type.sharding is None:
            continue
        for p in v.type.sharding.placements:
            if (isinstance(p, Shard) and letters[p.dim] not in einsum.output
                    and padding_levels(v.type, p.dim)):
                mask = Mask(index, p.dim, einsum.contract or "sum")
                if mask not in found:
                    found.append(mask)
    return found


def fill_value(dt: np.dtype, fill: str) -> Any:
    """The identity of the reduction `fill` in dtype `dt`: 0, or the lowest value for a max."""
    if fill == "sum":
        return np.zeros((), dt)
    if np.issubdtype(dt, np.floating):
        return np.asarray(-np.inf, dt)
    return np.asarray(np.iinfo(dt).min if np.issubdtype(dt, np.integer) else False, dt)


def mask_blocks(op: Operation, found: list[Mask], mesh: Mesh, rank: int,
                blocks: list[np.ndarray]) -> list[np.ndarray]:
    """`rank`'s operand blocks of `op` with the padding `found` (`masks(op)`) overwritten."""
    blocks = list(blocks)
    for m in found:
        t, b = op.operands[m.index].type, blocks[m.index]
        keep = np.arange(b.shape[m.dim]) < real_rows(t, m.dim, mesh, rank)
        keep = keep.reshape([-1 if d == m.dim else 1 for d in range(b.ndim)])
        blocks[m.index] = np.where(keep, b, fill_value(b.dtype, m.fill))
    return blocks


class RankOps:
    """Writes per-rank ops before `anchor` (spmd-partition's output: local types)."""

    def __init__(self, rewriter: Rewriter, anchor: Operation, mesh: Mesh):
        self.rewriter, self.anchor, self.mesh = rewriter, anchor, mesh

    def make(self, name: str, *operands: Value, **attrs: Any) -> Value:
        return self.rewriter.create(self.anchor, name, list(operands), attrs,
                                    loc=self.anchor.loc).result

    def const(self, value: Any, dt: np.dtype) -> Value:
        return self.make("constant", value=np.asarray(value, dtype=dt))

    def real_rows(self, t: TensorType, dim: int) -> Value:
        """`real_rows` of the running rank, an i64 scalar computed from spmd.axis_index."""
        i64 = dtypes.i64.np_dtype
        rows: Value | None = None
        for extent, steps in padding_levels(t, dim):
            left = self.const(extent, i64)
            for axis, step in steps:
                k = self.make("spmd.axis_index", axis=self.mesh.names[axis],
                              size=self.mesh.sizes[axis])
                left = self.make("sub", left, self.make("mul", k, self.const(step, i64)))
            rows = left if rows is None else self.make("min", rows, left)
        assert rows is not None, "a mask needs a padded level"
        return rows

    def mask(self, x: Value, t: TensorType, m: Mask) -> Value:
        """`x` (a rank's block of global type `t`) with its padding along `m.dim` replaced by
        the identity of `m.fill`."""
        local = x.type.shape
        rows = self.make("arange", shape=[local[m.dim]])
        rows = self.make("reshape", rows,
                         shape=[n if d == m.dim else 1 for d, n in enumerate(local)])
        keep = self.make("lt", rows, self.real_rows(t, m.dim))
        dt = x.type.dtype.np_dtype
        return self.make("where", keep, x, self.const(fill_value(dt, m.fill), dt))

    def pad(self, x: Value, dim: int, size: int) -> Value:
        """`x` with zero rows appended along `dim` up to `size` rows."""
        extra = size - x.type.shape[dim]
        if extra <= 0:
            return x
        shape = [extra if d == dim else n for d, n in enumerate(x.type.shape)]
        zeros = self.const(np.zeros(shape), x.type.dtype.np_dtype)
        return self.make("concat", x, zeros, axis=dim)

    def trim(self, x: Value, dim: int, size: int) -> Value:
        """`x` cut to its first `size` rows along `dim`."""
        shape = x.type.shape
        if shape[dim] == size:
            return x
        stops = [size if d == dim else n for d, n in enumerate(shape)]
        return self.make("slice", x, starts=[0] * len(shape), stops=stops,
                         steps=[1] * len(shape))
