"""Per-rank meanings of the ops whose work on a block is not their reference on that block
(with local attributes, `local.py`): lookups into a split table (gather) and a rank's position
on an axis (spmd.axis_index), in NumPy for the simulated mesh and, for gather, as the ops of
the per-rank program that spmd-partition writes (`rank_gather`) and bound to one rank's
coordinates for a runtime (`bind_rank`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import ShapeError
from tilefold.ir import Module, parse_module, print_module
from tilefold.ir.core import Operation, Value
from tilefold.ir.placements import axis_groups
from tilefold.ir.shapes import normalize_axis
from tilefold.ir.types import Mesh, Shard, TensorType
from tilefold.passes.rewrite import Rewriter

# (op, mesh, rank, the rank's operand blocks, attributes) -> the rank's result block
PerRank = Callable[[Operation, Mesh, int, list[np.ndarray], dict[str, Any]], np.ndarray]
PER_RANK: dict[str, PerRank] = {}


def coordinate(mesh: Mesh, rank: int, axis: int) -> int:
    """`rank`'s position along mesh axis `axis`."""
    return next(g.index(rank) for g in axis_groups(mesh, axis) if rank in g)


def block_strides(t: TensorType, dim: int) -> list[tuple[int, int]]:
    """(mesh axis, rows per step) for each axis splitting `dim` of sharded type `t`: the block a
    rank holds begins at the sum of its coordinates times these strides."""
    mesh = t.sharding.mesh
    size, strides = t.shape[dim], []
    for axis, (n, p) in enumerate(zip(mesh.sizes, t.sharding.placements, strict=True)):
        if isinstance(p, Shard) and p.dim == dim:
            size = -(-size // n)  # a padded shard's blocks are ceil(size/n) rows
            strides.append((axis, size))
    return strides


def block_start(t: TensorType, rank: int, dim: int) -> int:
    """Where along `dim` the block of sharded type `t` that `rank` holds begins."""
    mesh = t.sharding.mesh
    return sum(coordinate(mesh, rank, axis) * step for axis, step in block_strides(t, dim))


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


def axis_index(op: Operation, mesh: Mesh, rank: int, blocks: list[np.ndarray],
               attrs: dict[str, Any]) -> np.ndarray:
    """The rank's coordinate along the op's axis."""
    k = coordinate(mesh, rank, mesh.axis_index(attrs["axis"]))
    return np.asarray(k, dtype=attrs["dtype"].np_dtype)


PER_RANK.update({"gather": gather, "spmd.axis_index": axis_index})


def differs_on_blocks(op: Operation) -> bool:
    """Whether `op` as placed needs its per-rank meaning (its reference on the blocks would be
    wrong): a gather whose table is split along the looked-up dim."""
    if op.name != "gather" or op.operands[0].type.sharding is None:
        return False
    t = op.operands[0].type
    axis = normalize_axis("gather", op.attr("axis"), t.rank)
    return any(isinstance(p, Shard) and p.dim == axis for p in t.sharding.placements)


def rank_gather(op: Operation, table: TensorType, rewriter: Rewriter) -> Value:
    """The per-rank ops of a gather from `table` (its global type, split along the looked-up
    dim) whose operands are already the rank's blocks: subtract the first row the rank holds
    (its coordinates on the splitting axes times their strides, `spmd.axis_index`), look up the
    ids that fall in its rows and write zeros for the others; the sum over the ranks is the
    lookup (the result is P(sum) there). An id outside the table is an error on every rank
    (not a zero row, nor a padded shard's padding). `gather` above is the same in NumPy."""
    x, ids = op.operands
    mesh = table.sharding.mesh
    axis = normalize_axis("gather", op.attr("axis"), table.rank)
    dt = dtypes.i64  # row arithmetic in 64 bits: a narrow id type may not hold the offsets

    def make(name: str, *operands: Value, **attrs: Any) -> Value:
        return rewriter.create(op, name, list(operands), attrs, loc=op.loc).result

    consts: dict[int, Value] = {}

    def const(value: int) -> Value:
        if value not in consts:
            consts[value] = make("constant", value=np.asarray(value, dtype=dt.np_dtype))
        return consts[value]

    start = None
    for a, step in block_strides(table, axis):
        k = make("spmd.axis_index", axis=mesh.names[a], size=mesh.sizes[a])
        term = make("mul", k, const(step))
        start = term if start is None else make("add", start, term)
    size = table.shape[axis]
    if ids.type.dtype != dt:
        ids = make("cast", ids, dtype=dt)
    wrapped = make("where", make("lt", ids, const(0)), make("add", ids, const(size)), ids)
    valid = make("and", make("ge", wrapped, const(0)), make("lt", wrapped, const(size)))
    local = make("sub", wrapped, start)
    held = make("and", make("and", make("ge", local, const(0)),
                            make("lt", local, const(x.type.shape[axis]))), valid)
    # An id outside the global table reaches the local lookup as it came (outside the rank's
    # rows too), so the gather refuses it as the unsplit one would, instead of a zero row.
    rows = make("gather", x, make("where", held, local, make("where", valid, const(0), ids)),
                axis=axis)
    keep = make("reshape", held, shape=[1] * axis + list(ids.type.shape)
                + [1] * (table.rank - axis - 1))
    zero = make("constant", value=np.zeros((), dtype=x.type.dtype.np_dtype))
    return make("where", keep, rows, zero)


def bind_rank(module: Module, rank: int) -> Module:
    """A copy of per-rank program `module` for one rank: each `spmd.axis_index` replaced by
    that rank's coordinate as a constant, so a runtime that compiles the ops between
    collectives for one process (torchrun) can run it."""
    (mesh,) = module.meshes.values()
    copy = parse_module(print_module(module))
    for fn in copy.functions.values():
        rewriter = Rewriter(fn)
        for op in [op for op in fn.ops if op.name == "spmd.axis_index"]:
            value = axis_index(op, mesh, rank, [], op.opdef.full_attrs(op.attrs))
            made = rewriter.create(op, "constant", [], {"value": value}, loc=op.loc)
            name = op.result.name
            rewriter.replace(op, made.results)
            made.result.name = name
    return copy
