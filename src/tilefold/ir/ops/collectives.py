"""Collectives: ops that move blocks of a sharded tensor between the devices of one mesh axis.

Each op's types are global (`f32[8,16] @m[S(0),R]`); it changes the placement on one mesh axis,
never the global shape. Its `reference` is its meaning on the global value (the identity: moving
data does not change what the tensor is); `group_reference` is its meaning on the per-device
blocks of one axis group, which the simulated mesh (`tilefold.distributed.simulate`) runs.

    %g = all_gather(%x) {axis = "tp"} : f32[8,16] @m[S(0),R]          // x: @m[S(0),S(1)]
    %r = all_reduce(%p) {axis = "tp"} : f32[8,16] @m[R,R]             // p: @m[R,P(sum)]
    %s = reduce_scatter(%p) {axis = "tp", dim = 1} : f32[8,16] @m[R,S(1)]
    %t = all_to_all(%x) {axis = "tp", dim = 0} : f32[8,16] @m[R,S(0)]  // x: @m[R,S(1)]
    %y = redistribute(%x) {placements = "[R,S(1)]"} : f32[8,16] @m[R,S(1)]

Padded shards (`S(d,pad)`, uneven splits): `all_gather` drops the padding, `reduce_scatter`,
`all_to_all` and `local_slice` with `pad = true` give a padded shard (padding the blocks they
cut); `group_reference` takes the shape of the blocks the axis cuts (`level_shape`), which a
padded shard needs to know how many rows are real.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tilefold.errors import ShapeError, UnsupportedError, VerificationError
from tilefold.ir import types as ty
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.placements import reduce_partials, split_blocks, unpad

TRAITS = frozenset({"collective", "sharding"})  # not "pure": folding one would drop its meaning


def placed_operand(name: str, types: list[ty.TensorType]) -> ty.TensorType:
    t = types[0]
    if t.sharding is None:
        raise VerificationError(
            f"'{name}' needs an operand placed on a mesh (e.g. f32[8] @m[S(0)]), got {t}"
        )
    return t


def checked_result(name: str, t: ty.TensorType) -> list[ty.TensorType]:
    problem = ty.sharding_problem(t)
    if problem is not None:
        raise VerificationError(f"'{name}' result {t}: {problem}")
    return [t.without_layout()]


class Collective(OpDef):
    """Base of the one-axis collectives: operand `x`, attribute `axis` (a mesh axis name).

    A subclass says which placement it takes (`accepts`) and gives (`gives`), and what it does
    to one axis group's blocks (`group_reference`).
    """

    operands = ("x",)
    attributes = attr_table(axis=Attr("str", doc="the mesh axis the devices talk over"))
    traits = TRAITS
    takes: ClassVar[str] = ""  # the placement it accepts, for messages
    gives: ClassVar[str] = "R"  # what it leaves: "R", "S(dim)" (its `dim` attribute) or "same"

    @classmethod
    def accepts(cls, p: ty.Placement, attrs: dict[str, Any]) -> bool:
        raise NotImplementedError(f"collective {cls.name} must define accepts()")

    @classmethod
    def placement(cls, p: ty.Placement, attrs: dict[str, Any]) -> ty.Placement:
        """The placement it gives on its axis, as `gives` declares it."""
        if cls.gives == "same":
            return p
        if cls.gives == "S(dim)":
            return ty.Shard(attrs["dim"], attrs.get("pad", False))
        return ty.Replicate()

    @classmethod
    def group_reference(cls, blocks: list[np.ndarray], p: ty.Placement, attrs: dict[str, Any],
                        shape: tuple[int, ...] | None = None) -> list[np.ndarray]:
        """The blocks the devices of one axis group hold afterwards, from what they held;
        `shape` is the shape of the blocks the axis cuts (needed when `p` is a padded shard)."""
        raise NotImplementedError(f"collective {cls.name} must define group_reference()")

    @classmethod
    def check(cls, attrs: dict[str, Any], size: int, op: str) -> None:
        """Raise a VerificationError, naming `op`, if `attrs` do not fit an axis of `size`
        devices."""

    @classmethod
    def infer(cls, types: list[ty.TensorType], attrs: dict[str, Any]) -> list[ty.TensorType]:
        t = placed_operand(cls.name, types)
        try:
            axis = t.sharding.mesh.axis_index(attrs["axis"])
        except ShapeError as exc:
            raise VerificationError(f"'{cls.name}': {exc.message}") from None
        cls.check(attrs, t.sharding.mesh.sizes[axis], cls.name)
        p = t.sharding.placements[axis]
        if not cls.accepts(p, attrs):
            raise VerificationError(
                f"'{cls.name}' over axis {attrs['axis']} takes {cls.takes} there, but {t} is {p}"
            )
        new = cls.placement(p, attrs)
        result = t.with_sharding(t.sharding.replace(axis, new))
        for q in (p, new) if p != new else ():
            if isinstance(q, ty.Shard):
                nested(cls.name, t, axis, q.dim)
        return checked_result(cls.name, result)

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        return np.array(args[0], copy=True)  # moving blocks does not change the global value


def nested(name: str, t: ty.TensorType, axis: int, dim: int) -> None:
    """A shard on `axis` may change only if no later mesh axis splits the same dim: blocks of
    a later axis lie inside the blocks of an earlier one, so the inner axis must move first."""
    mesh = t.sharding.mesh
    for later in range(axis + 1, len(mesh.axes)):
        later_p = t.sharding.placements[later]
        if isinstance(later_p, ty.Shard) and later_p.dim == dim:
            raise VerificationError(
                f"'{name}' over axis {mesh.names[axis]} changes how dim {dim} of {t} is split, "
                f"but the later axis {mesh.names[later]} splits it too: redistribute that axis "
                "first"
            )


def dim_attr(doc: str) -> Attr:
    return Attr("int", doc=doc)


def cut_attrs(doc: str) -> dict[str, Attr]:
    """The attributes of a collective that gives a shard: its dim, and whether to pad."""
    return attr_table(**Collective.attributes, dim=dim_attr(doc),
                      pad=Attr("bool", False, doc="give S(dim,pad): pad uneven blocks"))


def whole(x: np.ndarray, p: ty.Placement, shape: tuple[int, ...] | None) -> np.ndarray:
    """Concatenated blocks `x` of shard `p` without their padding (`shape`: the level's)."""
    if not (isinstance(p, ty.Shard) and p.pad):
        return x
    if shape is None:
        raise VerificationError(f"gathering blocks of {p} needs the shape the axis cuts")
    return unpad(x, p.dim, shape[p.dim])


class FromPartial(Collective):
    takes = "a partial value P(sum|max)"

    @classmethod
    def accepts(cls, p: ty.Placement, attrs: dict[str, Any]) -> bool:
        return isinstance(p, ty.Partial)

    @classmethod
    def infer(cls, types: list[ty.TensorType], attrs: dict[str, Any]) -> list[ty.TensorType]:
        """Partials of a later axis are reduced first: a sum of maxes is not a max of sums."""
        result = super().infer(types, attrs)
        sharding = types[0].sharding
        axis = sharding.mesh.axis_index(attrs["axis"])
        mine = sharding.placements[axis]
        for later in range(axis + 1, len(sharding.placements)):
            other = sharding.placements[later]
            if isinstance(other, ty.Partial) and other != mine:
                raise VerificationError(
                    f"'{cls.name}' over axis {attrs['axis']} reduces {mine} of {types[0]}, but "
                    f"the later axis {sharding.mesh.names[later]} holds {other}: reduce that "
                    "axis first"
                )
        return result


@register
class AllReduce(FromPartial):
    """P(op) -> R: every device gets the reduction of all the partial blocks."""

    name = "all_reduce"

    @classmethod
    def group_reference(cls, blocks, p, attrs, shape=None):
        total = reduce_partials(blocks, p.op)
        return [total.copy() for _ in blocks]


@register
class ReduceScatter(FromPartial):
    """P(op) -> S(dim): device k gets block k of the reduction of the partial blocks."""

    name = "reduce_scatter"
    gives = "S(dim)"
    attributes = cut_attrs("the dim to split the sum on")

    @classmethod
    def group_reference(cls, blocks, p, attrs, shape=None):
        return split_blocks(reduce_partials(blocks, p.op), len(blocks), cls.placement(p, attrs))


class FromShard(Collective):
    takes = "a shard S(dim)"

    @classmethod
    def accepts(cls, p: ty.Placement, attrs: dict[str, Any]) -> bool:
        return isinstance(p, ty.Shard) and p.dim != attrs.get("dim")


@register
class AllGather(FromShard):
    """S(d) -> R: every device gets all the blocks, concatenated along d."""

    name = "all_gather"

    @classmethod
    def group_reference(cls, blocks, p, attrs, shape=None):
        full = whole(np.concatenate(blocks, axis=p.dim), p, shape)
        return [full.copy() for _ in blocks]


@register
class AllToAll(FromShard):
    """S(i) -> S(dim): device k sends piece j of its block (split along dim) to device j, and
    concatenates what it receives along i."""

    name = "all_to_all"
    gives = "S(dim)"
    takes = "a shard S(i) with i other than dim"
    attributes = cut_attrs("the dim to split on instead")

    @classmethod
    def group_reference(cls, blocks, p, attrs, shape=None):
        n, to = len(blocks), cls.placement(p, attrs)
        pieces = [split_blocks(b, n, to) for b in blocks]
        return [whole(np.concatenate([pieces[r][k] for r in range(n)], axis=p.dim), p, shape)
                for k in range(n)]


class FromReplicate(Collective):
    takes = "a replicated value R"

    @classmethod
    def accepts(cls, p: ty.Placement, attrs: dict[str, Any]) -> bool:
        return isinstance(p, ty.Replicate)


@register
class LocalSlice(FromReplicate):
    """R -> S(dim): device k keeps block k of its copy; no data moves."""

    name = "local_slice"
    gives = "S(dim)"
    attributes = cut_attrs("the dim to split")

    @classmethod
    def group_reference(cls, blocks, p, attrs, shape=None):
        n = len(blocks)
        return [split_blocks(b, n, cls.placement(p, attrs))[k] for k, b in enumerate(blocks)]


@register
class Broadcast(FromReplicate):
    """R -> R: every device gets device `root`'s copy (makes diverged replicas agree)."""

    name = "broadcast"
    gives = "same"
    attributes = attr_table(**Collective.attributes,
                            root=Attr("int", 0, doc="the device whose copy is sent"))

    @classmethod
    def check(cls, attrs: dict[str, Any], size: int, op: str) -> None:
        if not 0 <= attrs["root"] < size:
            raise VerificationError(f"'{op}' root {attrs['root']} is not a device of "
                                    f"axis {attrs['axis']} (size {size})")

    @classmethod
    def group_reference(cls, blocks, p, attrs, shape=None):
        return [blocks[attrs["root"]].copy() for _ in blocks]


@register
class Permute(FromShard):
    """S(d) -> S(d): device k sends its block to device (k + shift) mod n (a ring step of
    send/recv); globally the blocks along d rotate by `shift`."""

    name = "permute"
    gives = "same"
    takes = "an unpadded shard S(dim) (rotating padded blocks would move padding inside)"
    attributes = attr_table(**Collective.attributes,
                            shift=Attr("int", 1, doc="how many devices along the ring to send"))

    @classmethod
    def accepts(cls, p: ty.Placement, attrs: dict[str, Any]) -> bool:
        return isinstance(p, ty.Shard) and not p.pad

    @classmethod
    def group_reference(cls, blocks, p, attrs, shape=None):
        n = len(blocks)
        return [blocks[(k - attrs["shift"]) % n].copy() for k in range(n)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        raise UnsupportedError(
            "'permute' moves blocks between devices, so its global meaning depends on the mesh: "
            "run the function on the simulated mesh (tilefold.distributed.simulate)"
        )


@register
class Redistribute(OpDef):
    """Any placements -> `placements` (one per mesh axis), the global value unchanged; the
    `expand-redistribute` pass turns it into the collectives above. A partial placement can be
    kept but not made: no collective turns a whole value into parts."""

    name = "redistribute"
    operands = ("x",)
    attributes = attr_table(placements=Attr("str", doc='the target, e.g. "[S(0),R]"'))
    traits = TRAITS

    @classmethod
    def target(cls, t: ty.TensorType, attrs: dict[str, Any]) -> tuple[ty.Placement, ...]:
        try:
            target = ty.parse_placements(attrs["placements"])
        except ShapeError as exc:
            raise VerificationError(f"'redistribute': {exc.message}") from None
        names = t.sharding.mesh.names
        for axis, (old, new) in enumerate(zip(t.sharding.placements, target, strict=False)):
            if isinstance(new, ty.Partial) and new != old:
                raise VerificationError(
                    f"'redistribute' of {t} cannot make axis {names[axis]} {new}: only a "
                    "partial value can stay partial"
                )
            kept = [b for b in range(axis + 1, len(target)) if isinstance(target[b], ty.Partial)
                    and target[b] != old]
            if isinstance(old, ty.Partial) and new != old and kept:
                raise VerificationError(
                    f"'redistribute' of {t} cannot reduce axis {names[axis]}'s {old} while the "
                    f"later axis {names[kept[0]]} stays {target[kept[0]]}: a sum of maxes is "
                    "not a max of sums; reduce that axis too"
                )
        return target

    @classmethod
    def infer(cls, types: list[ty.TensorType], attrs: dict[str, Any]) -> list[ty.TensorType]:
        t = placed_operand(cls.name, types)
        target = cls.target(t, attrs)
        result = t.with_sharding(ty.Sharding(t.sharding.mesh, target))
        return checked_result(cls.name, result)

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        return np.array(args[0], copy=True)

