"""Per-rank collectives: the collectives of a partitioned (SPMD) program, on the block one rank
holds rather than on the global tensor.

The `spmd-partition` pass turns each global collective (`ir/ops/collectives.py`) into its
per-rank form. Types carry no placements; each op says what a runtime needs: the mesh axis
whose devices talk, how many they are (`size`), and the dim or reduction the global
placement implied. Result shapes are local:

    %s = spmd.all_reduce(%p) {axis = "tp", size = 4} : f32[3,12]         // p: f32[3,12]
    %g = spmd.all_gather(%x) {axis = "tp", size = 4, dim = 1} : f32[3,16]  // x: f32[3,4]
    %r = spmd.reduce_scatter(%p) {axis = "tp", size = 4, dim = 0} : f32[2,8]  // p: f32[8,8]
    %t = spmd.all_to_all(%x) {axis = "tp", size = 2, dim = 0, gather_dim = 1} : f32[2,8]

Each form maps to its global op (`of`): `source` is the placement on the axis that the
global op took, so `group_reference` is the global op's, run on one axis group's blocks.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tilefold.errors import UnsupportedError, VerificationError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.ops import collectives as glob
from tilefold.ir.types import PARTIAL_REDUCTIONS, Partial, Placement, Replicate, Shard, TensorType

RANK_FORM: dict[str, type[RankCollective]] = {}  # global collective name -> its per-rank form


def rank_form(cls: type[RankCollective]) -> type[RankCollective]:
    """Register a per-rank collective as an op and as the per-rank form of `cls.of`."""
    RANK_FORM[cls.of.name] = cls
    return register(cls)


def _reduce() -> Attr:
    return Attr("str", "sum", choices=PARTIAL_REDUCTIONS, doc="how the partial blocks combine")


def _dim(doc: str) -> Attr:
    return Attr("int", doc=doc)


class RankCollective(OpDef):
    """Base of the per-rank collectives: operand `x` (this rank's block), attributes `axis`
    (a mesh axis name) and `size` (the number of devices on it)."""

    operands = ("x",)
    attributes = attr_table(axis=Attr("str", doc="the mesh axis the devices talk over"),
                            size=Attr("int", doc="how many devices the axis has"))
    traits = frozenset({"collective", "per_rank"})  # not "pure": it moves data between ranks
    of: ClassVar[type[glob.Collective]]

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        """The placement on the axis that the global collective took."""
        raise NotImplementedError(f"per-rank collective {cls.name} must define source()")

    @classmethod
    def placement_attrs(cls, p: Placement) -> dict[str, Any]:
        """The attributes that say `p` (the inverse of `source`)."""
        return {}

    @classmethod
    def global_attrs(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        """The attributes the global collective's `group_reference` reads."""
        return {k: v for k, v in attrs.items() if k in cls.of.attributes}

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        (t,) = types
        n = attrs["size"]
        if t.sharding is not None:
            raise VerificationError(
                f"'{cls.name}' works on one rank's block, which carries no placement; got {t} "
                f"(use the global '{cls.of.name}' on placed types)"
            )
        if n < 1:
            raise VerificationError(f"'{cls.name}' size {n}: an axis has at least one device")
        shape = list(t.shape)
        before = cls.source(attrs)
        after = cls.of.placement(before, cls.global_attrs(attrs))
        for p in (before, after):
            if isinstance(p, Shard) and not 0 <= p.dim < t.rank:
                raise VerificationError(f"'{cls.name}' dim {p.dim} is out of range for {t}")
        if isinstance(before, Shard) and isinstance(shape[before.dim], int):
            shape[before.dim] *= n
        if isinstance(after, Shard) and isinstance(shape[after.dim], int):
            if shape[after.dim] % n:
                raise VerificationError(
                    f"'{cls.name}' splits dim {after.dim} ({shape[after.dim]}) of {t} over "
                    f"{n} devices of axis {attrs['axis']}: it does not split evenly"
                )
            shape[after.dim] //= n
        return [TensorType(tuple(shape), t.dtype)]

    @classmethod
    def group_reference(cls, blocks: list[np.ndarray], attrs: dict[str, Any]
                        ) -> list[np.ndarray]:
        """The blocks one axis group holds afterwards: the global collective's meaning."""
        return cls.of.group_reference(blocks, cls.source(attrs), cls.global_attrs(attrs))

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        raise UnsupportedError(
            f"'{cls.name}' exchanges blocks between ranks, so one rank alone cannot run it: run "
            "the per-rank program with tilefold.distributed.run_ranks or the torchrun executor"
        )


class ReducingCollective(RankCollective):
    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        return Partial(attrs["reduce"])

    @classmethod
    def placement_attrs(cls, p: Placement) -> dict[str, Any]:
        assert isinstance(p, Partial)
        return {"reduce": p.op}


@rank_form
class RankAllReduce(ReducingCollective):
    """Every rank gets the sum (or max) of the blocks of its group."""

    name = "spmd.all_reduce"
    of = glob.AllReduce
    attributes = attr_table(**RankCollective.attributes, reduce=_reduce())


@rank_form
class RankReduceScatter(ReducingCollective):
    """Rank k of a group gets block k (along `dim`) of the sum of the group's blocks."""

    name = "spmd.reduce_scatter"
    of = glob.ReduceScatter
    attributes = attr_table(**RankCollective.attributes, dim=_dim("the dim the sum is split on"),
                            reduce=_reduce())


@rank_form
class RankAllGather(RankCollective):
    """Every rank gets the group's blocks concatenated along `dim`."""

    name = "spmd.all_gather"
    of = glob.AllGather
    attributes = attr_table(**RankCollective.attributes, dim=_dim("the dim to concatenate"))

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        return Shard(attrs["dim"])

    @classmethod
    def placement_attrs(cls, p: Placement) -> dict[str, Any]:
        assert isinstance(p, Shard)
        return {"dim": p.dim}

    @classmethod
    def global_attrs(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        return {"axis": attrs["axis"]}  # the global op has no dim: its operand's placement says


@rank_form
class RankAllToAll(RankCollective):
    """Rank k splits its block along `dim`, sends piece j to rank j, and concatenates what it
    receives along `gather_dim`."""

    name = "spmd.all_to_all"
    of = glob.AllToAll
    attributes = attr_table(**RankCollective.attributes, dim=_dim("the dim to split and send"),
                            gather_dim=_dim("the dim the received pieces are joined on"))

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        if attrs["gather_dim"] == attrs["dim"]:
            raise VerificationError(f"'{cls.name}' needs gather_dim other than dim "
                                    f"({attrs['dim']})")
        return Shard(attrs["gather_dim"])

    @classmethod
    def placement_attrs(cls, p: Placement) -> dict[str, Any]:
        assert isinstance(p, Shard)
        return {"gather_dim": p.dim}


@rank_form
class RankLocalSlice(RankCollective):
    """Rank k of a group keeps block k of its block along `dim`; no data moves."""

    name = "spmd.local_slice"
    of = glob.LocalSlice
    attributes = attr_table(**RankCollective.attributes, dim=_dim("the dim to split"))

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        return Replicate()


@rank_form
class RankBroadcast(RankCollective):
    """Every rank of a group gets the block of its group's rank `root`."""

    name = "spmd.broadcast"
    of = glob.Broadcast
    attributes = attr_table(**RankCollective.attributes,
                            root=Attr("int", 0, doc="the rank along the axis whose block is sent"))

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        if not 0 <= attrs["root"] < attrs["size"]:
            raise VerificationError(f"'{cls.name}' root {attrs['root']} is not a device of "
                                    f"axis {attrs['axis']} (size {attrs['size']})")
        return Replicate()


@rank_form
class RankPermute(RankCollective):
    """Rank k of a group sends its block to rank (k + shift) mod size (send/recv); shapes stay."""

    name = "spmd.permute"
    of = glob.Permute
    attributes = attr_table(**RankCollective.attributes,
                            shift=Attr("int", 1, doc="how many ranks along the ring to send"))

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        return Replicate()  # the block moves whole: its shape does not change
