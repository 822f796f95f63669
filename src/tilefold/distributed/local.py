"""What it takes to run an ordinary op on the blocks each rank holds: its declared placements
agree with its sharding rule, and attributes that name global sizes become the rank's sizes.

The simulated mesh (`simulate.py`) and the `spmd-partition` pass (`partition.py`) both ask
these questions, so a global program on the simulator and its per-rank program agree.

    reshape(%h) {shape = [8,4,16]} : f64[8,4,16] @m[S(0),S(1)]    dp=2, tp=4
        -> on each rank: reshape {shape = [4,1,16]}, the local shape of its result
    slice(%x) {starts = [0], stops = [4], ...} : f64[4] @m[S(0)]  -> refused: global bounds
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tilefold.distributed.rules import result_placements
from tilefold.errors import TilefoldError
from tilefold.ir.core import Operation
from tilefold.ir.types import Mesh, Placement, Replicate, TensorType, format_placements, local_shape


class PlacementError(TilefoldError):
    """An op cannot run on per-rank blocks as its placements stand."""


def placements_in(t: TensorType, mesh: Mesh) -> tuple[Placement, ...]:
    """A type's placements; an unplaced type is replicated on every axis."""
    return t.sharding.placements if t.sharding is not None else (Replicate(),) * len(mesh.axes)


def check_placements(op: Operation, mesh: Mesh) -> None:
    """An ordinary op's declared placements must be those its sharding rule derives (R on the
    axes without a rule, whose operands must be R there): running it on blocks means nothing
    otherwise."""
    operands = [placements_in(v.type, mesh) for v in op.operands]
    derived, why = result_placements(op, operands)
    if not operands:  # a constant, arange, ...: the same everywhere
        derived = [Replicate()] * len(mesh.axes)
    for axis, placement in enumerate(derived):
        if placement is None and any(ps[axis] != Replicate() for ps in operands):
            raise PlacementError(
                f"'{op.name}' has operands placed {[format_placements(p) for p in operands]}"
                f" but {why}: redistribute them first (passes: propagate-sharding)"
            )
    want = tuple(Replicate() if p is None else p for p in derived)
    for result in op.results:
        if placements_in(result.type, mesh) != want:
            raise PlacementError(
                f"'{op.name}' result %{result.name} is declared {result.type}, but its "
                f"operands give {format_placements(want)} ({why})"
            )


def local_type(t: TensorType) -> TensorType:
    """The type of the block one rank holds: the local shape, no placement (the global layout's
    strides describe a block only when the block is the whole tensor)."""
    if t.sharding is None:
        return t
    shape = local_shape(t)
    return TensorType(shape, t.dtype, t.strides if shape == t.shape else None)


def _result_shape(op: Operation) -> dict[str, Any]:
    """reshape's target becomes the local shape of its result (the rule ties the blocks)."""
    return {**op.attrs, "shape": local_shape(op.result.type)}


def _whole_dims(op: Operation) -> dict[str, Any]:
    """slice: a split dim is one the slice keeps whole (its rule fixes the others), so a rank
    takes all of its block there."""
    full, local = op.operands[0].type.shape, local_shape(op.operands[0].type)
    starts, stops = list(op.attr("starts")), list(op.attr("stops"))
    for d, (n, m) in enumerate(zip(full, local, strict=True)):
        if n != m:
            starts[d], stops[d] = 0, m
    return {**op.attrs, "starts": starts, "stops": stops}


# Ops whose attributes name global sizes, and how a rank's attributes follow from its types.
LOCAL_ATTRS: dict[str, Callable[[Operation], dict[str, Any]]] = {
    "reshape": _result_shape,  # [8,64] @[S(0)] -> [8,4,16] @[S(0)]: shape = [4,4,16] on 2
    "slice": _whole_dims,  # [4,6] @[S(0)] -> [4,3] @[S(0)]: starts [0,0], stops [2,3] on 2
}

# Attributes of kind "shape" name sizes; these others do too.
SIZED: dict[str, tuple[str, ...]] = {
    "slice": ("starts", "stops"),
}


def local_attrs(op: Operation, mesh: Mesh) -> dict[str, Any]:
    """The attributes of `op` as one rank runs it on its blocks. An op whose values are
    replicated everywhere keeps its own; a sharded one with size attributes and no entry in
    `LOCAL_ATTRS` is refused (PlacementError)."""
    types = [v.type for v in (*op.operands, *op.results)]
    if all(all(p == Replicate() for p in placements_in(t, mesh)) for t in types):
        return dict(op.attrs)
    rewrite = LOCAL_ATTRS.get(op.name)
    if rewrite is not None:
        return rewrite(op)
    sized = [k for k, spec in op.opdef.attributes.items()
             if spec.kind == "shape" and op.attr(k) is not None]
    sized += [k for k in SIZED.get(op.name, ()) if op.attr(k) is not None]
    if sized:
        placed = ", ".join(f"%{v.name}: {v.type}" for v in (*op.operands, *op.results))
        raise PlacementError(
            f"'{op.name}' attribute(s) {', '.join(sized)} name global sizes, and there is no "
            f"rule for them per rank ({placed}): redistribute its operands to R so it runs "
            "replicated, or add the op to LOCAL_ATTRS in tilefold/distributed/local.py"
        )
    return dict(op.attrs)
