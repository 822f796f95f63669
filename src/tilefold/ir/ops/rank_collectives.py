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
        """The placement on the axis that the global collective took: R unless a subclass
        says otherwise."""
        return Replicate()

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
        before, global_attrs = cls.source(attrs), cls.global_attrs(attrs)
        cls.of.check(global_attrs, n, cls.name)
        after = cls.of.placement(before, global_attrs)
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
    """A per-rank collective whose global op took a partial value, reduced by `reduce`."""

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        return Partial(attrs["reduce"])

    @classmethod
    def placement_attrs(cls, p: Placement) -> dict[str, Any]:
        assert isinstance(p, Partial)
        return {"reduce": p.op}


class ShardedCollective(RankCollective):
    """A per-rank collective whose global op took a shard, the dim named by `source_dim`."""

    source_dim: ClassVar[str] = "dim"

    @classmethod
    def source(cls, attrs: dict[str, Any]) -> Placement:
        p = Shard(attrs[cls.source_dim])
        if not cls.of.accepts(p, cls.global_attrs(attrs)):
            raise VerificationError(f"'{cls.name}' {cls.source_dim} {p.dim}: the global "
                                    f"'{cls.of.name}' takes {cls.of.takes}")
        return p

    @classmethod
    def placement_attrs(cls, p: Placement) -> dict[str, Any]:
        assert isinstance(p, Shard)
        return {cls.source_dim: p.dim}


def _declare(of: type[glob.Collective], base: type[RankCollective], doc: str,
             **attributes: Attr) -> type[RankCollective]:
    """The per-rank form `spmd.<name>` of the global collective `of`."""
    body = {"__doc__": doc, "name": f"spmd.{of.name}", "of": of,
            "attributes": attr_table(**RankCollective.attributes, **attributes)}
    if "gather_dim" in attributes:
        body["source_dim"] = "gather_dim"
    return rank_form(type(f"Rank{of.__name__}", (base,), body))


def _dim(doc: str) -> Attr:
    return Attr("int", doc=doc)


def _reduce() -> Attr:
    return Attr("str", "sum", choices=PARTIAL_REDUCTIONS, doc="how the partial blocks combine")


RankAllReduce = _declare(glob.AllReduce, ReducingCollective,
                         "Every rank gets the sum (or max) of the blocks of its group.",
                         reduce=_reduce())
RankReduceScatter = _declare(
    glob.ReduceScatter, ReducingCollective,
    "Rank k of a group gets block k (along `dim`) of the sum of the group's blocks.",
    dim=_dim("the dim the sum is split on"), reduce=_reduce())
RankAllGather = _declare(glob.AllGather, ShardedCollective,
                         "Every rank gets the group's blocks concatenated along `dim`.",
                         dim=_dim("the dim to concatenate"))
RankAllToAll = _declare(
    glob.AllToAll, ShardedCollective,
    "Rank k splits its block along `dim`, sends piece j to rank j, and concatenates what it "
    "receives along `gather_dim`.",
    dim=_dim("the dim to split and send"),
    gather_dim=_dim("the dim the received pieces are joined on"))
RankLocalSlice = _declare(glob.LocalSlice, RankCollective,
                          "Rank k of a group keeps block k of its block along `dim`; no data "
                          "moves.", dim=_dim("the dim to split"))
RankBroadcast = _declare(glob.Broadcast, RankCollective,
                         "Every rank of a group gets the block of its group's rank `root`.",
                         root=Attr("int", 0, doc="the rank along the axis whose block is sent"))
RankPermute = _declare(
    glob.Permute, RankCollective,
    "Rank k of a group sends its block to rank (k + shift) mod size (send/recv); the block "
    "moves whole, so its shape stays.",
    shift=Attr("int", 1, doc="how many ranks along the ring to send"))
