"""spmd-partition: turn a function whose values are placed on one mesh (after
propagate-sharding and expand-redistribute) into the program every rank runs: local shapes,
no placements, each collective in its per-rank form, size attributes made local.

    mesh @m [dp=2, tp=4]
    %h = matmul(%x, %w1) : f32[8,32] @m[S(0),S(1)]      ->  %h = matmul(%x, %w1) : f32[4,8]
    %s = all_reduce(%p) {axis = "tp"} : f32[8,16] @m[S(0),R]
        ->  %s = spmd.all_reduce(%p) {axis = "tp", size = 4} : f32[4,16]
    %r = reshape(%h) {shape = [8,4,8]} : f32[8,4,8] @m[S(0),S(1)]
        ->  %r = reshape(%h) {shape = [4,1,8]} : f32[4,1,8]

An op reducing over a padded dim (`S(d,pad)`) first masks the padding rows of its operands
(zeros for a sum, -inf for a max, from `spmd.axis_index`: `padding.py`); a collective that
makes a padded shard pads its operand with zero rows first, one that gathers one trims after.

A gather from a table split along the looked-up dim (a vocab-parallel embedding) becomes the
lookup of the rows the rank holds, zeros elsewhere (`per_rank.rank_gather`): its result is
P(sum), which a later all_reduce completes. The mesh declaration stays in the module: a
runtime reads the axes from it. Every ordinary op's placements are checked against its
sharding rule first, and its local result types against what the op infers from its local
operands.
"""

from __future__ import annotations

from typing import Any

from tilefold.distributed.local import PlacementError, check_placements, local_attrs, local_type
from tilefold.distributed.padding import RankOps, masks
from tilefold.distributed.per_rank import differs_on_blocks, rank_gather
from tilefold.errors import PassError, TilefoldError
from tilefold.ir import Function
from tilefold.ir.core import Operation
from tilefold.ir.ops.collectives import Collective
from tilefold.ir.ops.rank_collectives import RANK_FORM
from tilefold.ir.types import Mesh, Shard, TensorType, level_shape, local_shape
from tilefold.passes.base import Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter


class PartitionError(PassError):
    """A placed function cannot be turned into a per-rank program as written."""


def function_meshes(fn: Function) -> set[Mesh]:
    """The meshes `fn`'s values and results are placed on."""
    meshes = {v.type.sharding.mesh for v in fn.values() if v.type.sharding is not None}
    return meshes | {t.sharding.mesh for t in fn.result_types if t.sharding is not None}


def rank_attrs(op: Operation, mesh: Mesh) -> tuple[str, dict[str, Any]]:
    """A global collective's per-rank op name and attributes: the axis size and what the
    operand's placement on the axis implied (the dim gathered, the reduction)."""
    form = RANK_FORM.get(op.name)
    if form is None:
        raise PartitionError(f"spmd-partition: collective '{op.name}' has no per-rank form "
                             "(add one in ir/ops/rank_collectives.py)")
    axis = mesh.axis_index(op.attr("axis"))
    placement = op.operands[0].type.sharding.placements[axis]
    attrs = {k: v for k, v in op.attrs.items() if k != "pad"}  # padding: see `collective`
    if isinstance(placement, Shard):
        placement = Shard(placement.dim)
    return form.name, {**attrs, "size": mesh.sizes[axis], **form.placement_attrs(placement)}


@register_pass
class SpmdPartition(Pass):
    """Global placed types to each rank's program: local shapes, per-rank collectives."""

    statistics = (
        Statistic("num-local-ops", "ordinary ops given local types"),
        Statistic("num-collectives", "collectives turned into their per-rank form"),
        Statistic("num-local-attrs", "ops whose size attributes became local"),
        Statistic("num-split-gathers", "gathers from a table split by rows, made per rank"),
        Statistic("num-padding-masks", "padded operand dims masked before a reduction"),
    )

    def run_on_function(self, fn: Function) -> None:
        meshes = function_meshes(fn)
        if not meshes:
            return  # nothing placed: already one program for every rank
        if len(meshes) > 1:
            named = ", ".join(sorted(f"@{m.name}" for m in meshes))
            raise PartitionError(f"spmd-partition: @{fn.name} is placed on several meshes "
                                 f"({named}); partition a function placed on one")
        (mesh,) = meshes
        self.split_tables: dict[Operation, TensorType] = {}  # gathers from tables split by rows
        # global types, kept for the padding: which rows of a rank's block are real
        self.global_types = {v: v.type for v in fn.values()}
        plan = [(op, self.plan(op, mesh)) for op in fn.body.ops if not op.has_trait("terminator")]
        found = {op: masks(op) for op, _ in plan if not issubclass(op.opdef, Collective)}
        for arg in fn.args:
            arg.type = local_type(arg.type)
        rewriter = Rewriter(fn)
        for op, (name, attrs) in plan:
            rank_ops = RankOps(rewriter, op, mesh)
            if name != op.name:
                self.collective(op, name, attrs, rank_ops, mesh)
                self.count("num-collectives")
            else:
                for m in found[op]:
                    x = op.operands[m.index]
                    op.operands[m.index] = rank_ops.mask(x, self.global_types[x], m)
                    self.count("num-padding-masks")
                self.localize(op, attrs)
            if op in self.split_tables:
                name = op.result.name
                value = rank_gather(op, self.split_tables[op], rewriter)
                rewriter.replace(op, [value])
                value.name = name
                self.global_types[value] = self.global_types[op.result]
                self.count("num-split-gathers")
        fn.result_types = [v.type for v in fn.outputs]

    def collective(self, op: Operation, name: str, attrs: dict[str, Any], rank_ops: RankOps,
                   mesh: Mesh) -> None:
        """A global collective as its per-rank form; a padded shard it makes or takes is padded
        with zero rows before (the per-rank form cuts even blocks) or trimmed after."""
        t, out = self.global_types[op.operands[0]], op.result.type
        axis = mesh.axis_index(op.attr("axis"))
        n = mesh.sizes[axis]
        before, after = t.sharding.placements[axis], out.sharding.placements[axis]
        x = op.operands[0]
        if isinstance(after, Shard) and after.pad and after != before:
            x = rank_ops.pad(x, after.dim, -(-level_shape(out, axis)[after.dim] // n) * n)
        made = rank_ops.make(name, x, **attrs)
        if isinstance(before, Shard) and before.pad and before != after:
            made = rank_ops.trim(made, before.dim, local_shape(out)[before.dim])
        name = op.result.name
        rank_ops.rewriter.replace(op, [made])
        made.name = name
        self.global_types[made] = out

    def plan(self, op: Operation, mesh: Mesh) -> tuple[str, dict[str, Any]]:
        """What `op` becomes (its name and attributes), decided on the global types."""
        if op.regions:
            raise PartitionError(f"spmd-partition: '{op.name}' has regions; partition the "
                                 "function before fusion")
        if op.name == "redistribute":
            raise PartitionError(
                f"spmd-partition: %{op.result.name} = redistribute(%{op.operands[0].name}) : "
                f"{op.result.type} is still high-level: run expand-redistribute first"
            )
        if issubclass(op.opdef, Collective):
            return rank_attrs(op, mesh)
        if differs_on_blocks(op):
            self.split_tables[op] = op.operands[0].type
        try:
            check_placements(op, mesh)
            attrs = local_attrs(op, mesh)
        except PlacementError as exc:
            raise PartitionError(f"spmd-partition: {exc.message}") from None
        if attrs != op.attrs:
            self.count("num-local-attrs")
        return op.name, attrs

    def localize(self, op: Operation, attrs: dict[str, Any]) -> None:
        """Give an ordinary op its local attributes and result types, and check that the op
        infers those types from its (already local) operands."""
        before = [r.type for r in op.results]
        op.attrs = attrs
        for r in op.results:
            r.type = local_type(r.type)
        try:
            got = op.opdef.infer_op([v.type for v in op.operands], op.opdef.full_attrs(attrs),
                                    op.regions)
        except TilefoldError as exc:
            got, why = None, exc.message
        for r, t, g in zip(op.results, before, got or [None] * len(before), strict=True):
            if g is None or (g.shape, g.dtype) != (r.type.shape, r.type.dtype):
                said = f"infers {g}" if g is not None else f"refuses them: {why}"
                raise PartitionError(
                    f"spmd-partition: '{op.name}' %{r.name}: {t} means {r.type} on each rank, "
                    f"but on the local operands ({', '.join(str(v.type) for v in op.operands)})"
                    f" the op {said}; its attributes may name global sizes (see LOCAL_ATTRS "
                    "in tilefold/distributed/local.py)"
                )
        self.count("num-local-ops")
