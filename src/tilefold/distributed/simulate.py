"""The simulated mesh: runs a function on every rank of a mesh in one process, each rank on its
own blocks, so that a sharded program has an oracle (its global program, run by the interpreter).

Ordinary ops run their reference on each rank's blocks, once their declared placements are
checked against their sharding rules and their size attributes made local (`local.py`), or
their per-rank meaning where a block's work differs (`per_rank.py`: gather from a split table);
collectives run their `group_reference` on the blocks of each group of ranks along their axis;
`redistribute` means "assemble the global value, then cut it to the new placements" (the
`expand-redistribute` pass must agree). Padding rows of padded shards hold NaN here, and an op
reducing over a padded dim first masks them (`padding.py`), as the per-rank program does. A
per-rank program (`spmd-partition`'s output: local types, `spmd.*` collectives) runs the same
way with `run_ranks`, on the module's one mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tilefold.distributed.local import PlacementError, check_placements, local_attrs
from tilefold.distributed.padding import mask_blocks, masks
from tilefold.distributed.per_rank import PER_RANK
from tilefold.errors import ShapeError, TilefoldError, UnsupportedError
from tilefold.ir.core import Block, Function, Module, Operation, Value
from tilefold.ir.interpreter import bind_symbols, run_region
from tilefold.ir.ops.collectives import Collective, Redistribute
from tilefold.ir.ops.rank_collectives import RankCollective
from tilefold.ir.placements import assemble, axis_groups, scatter
from tilefold.ir.types import Mesh, TensorType, level_shape, local_shape

Ranks = list[np.ndarray]  # one block per rank, in rank order


class SimulationError(TilefoldError):
    """A sharded program cannot run on the simulated mesh as written."""


def function_mesh(fn: Function, module: Module | None = None) -> Mesh:
    """The one mesh `fn`'s types are placed on (or the module's only mesh if none is named)."""
    meshes = {v.type.sharding.mesh for v in fn.values() if v.type.sharding is not None}
    meshes |= {t.sharding.mesh for t in fn.result_types if t.sharding is not None}
    if not meshes and module is not None and len(module.meshes) == 1:
        meshes = set(module.meshes.values())
    if len(meshes) != 1:
        named = ", ".join(sorted(f"@{m.name}" for m in meshes)) or "none"
        raise SimulationError(
            f"@{fn.name} must be placed on exactly one mesh to be simulated (it uses: {named})"
        )
    return meshes.pop()


def split(x: np.ndarray, t: TensorType, mesh: Mesh,
          rng: np.random.Generator | None = None) -> Ranks:
    """Each rank's block of global value `x` of type `t` (an unplaced type: a copy on each)."""
    if t.sharding is None:
        return [np.array(x, copy=True) for _ in range(mesh.size)]
    return scatter(np.asarray(x), t, rng)


def join(blocks: Ranks, t: TensorType) -> np.ndarray:
    """The global value of per-rank `blocks` of type `t` (replicas checked to agree)."""
    if t.sharding is None:
        for rank, b in enumerate(blocks[1:], 1):
            if b.tobytes() != blocks[0].tobytes():
                raise SimulationError(f"an unplaced {t} differs between rank 0 and rank {rank}")
        return blocks[0]
    return assemble(blocks, t)


class MeshRun:
    """One run of a function over every rank of `mesh`."""

    def __init__(self, fn: Function, mesh: Mesh):
        self.fn = fn
        self.mesh = mesh
        for v in fn.values():
            if not v.type.is_static:
                raise UnsupportedError(
                    f"the simulated mesh needs static shapes; %{v.name} is {v.type}: bind the "
                    "symbolic dims first (passes: shape-inference)"
                )

    def run(self, rank_args: Sequence[Ranks]) -> list[Ranks]:
        env: dict[Value, Ranks] = {}
        for param, blocks in zip(self.fn.args, rank_args, strict=True):
            if len(blocks) != self.mesh.size:
                raise ShapeError(f"%{param.name} has {len(blocks)} blocks for "
                                 f"{self.mesh.size} ranks")
            for rank, b in enumerate(blocks):
                check_arg_block(param, b, rank)
            env[param] = [np.asarray(b) for b in blocks]
        return self.block(self.fn.body, env)

    def block(self, block: Block, env: dict[Value, Ranks]) -> list[Ranks]:
        for op in block.ops:
            args = [env[v] for v in op.operands]
            if op.has_trait("terminator"):
                return args
            outs = self.op(op, args)
            for result, blocks in zip(op.results, outs, strict=True):
                for rank, b in enumerate(blocks):
                    check_block(op, result, b, rank)
                env[result] = blocks
        raise AssertionError("block without terminator")

    def op(self, op: Operation, args: list[Ranks]) -> list[Ranks]:
        if issubclass(op.opdef, Redistribute):
            t_in, t_out = op.operands[0].type, op.result.type
            return [scatter(assemble(args[0], t_in), t_out)]
        if issubclass(op.opdef, Collective | RankCollective):
            return [self.collective(op, args[0])]
        self.check_placements(op)
        try:
            attrs = op.opdef.full_attrs(local_attrs(op, self.mesh))
        except PlacementError as exc:
            raise SimulationError(exc.message) from None
        per_rank = []
        local = PER_RANK.get(op.name)
        padded = masks(op)  # padding rows a reduction must not see
        for rank in range(self.mesh.size):
            blocks = mask_blocks(op, padded, self.mesh, rank, [a[rank] for a in args])
            res = (local(op, self.mesh, rank, blocks, attrs) if local is not None
                   else op.opdef.reference_op(blocks, attrs, op.regions, run_region))
            per_rank.append(list(res) if isinstance(res, list | tuple) else [res])
        return [[np.asarray(r[i]) for r in per_rank] for i in range(len(op.results))]

    def collective(self, op: Operation, blocks: Ranks) -> Ranks:
        """A collective on each group of ranks along its axis: a global one on placed blocks,
        or the per-rank form of a partitioned program."""
        attrs = op.opdef.full_attrs(op.attrs)
        axis = self.mesh.axis_index(attrs["axis"])
        if issubclass(op.opdef, RankCollective):
            if attrs["size"] != self.mesh.sizes[axis]:
                raise SimulationError(
                    f"'{op.name}' says axis {attrs['axis']} has {attrs['size']} devices, but "
                    f"{self.mesh.declaration()} gives it {self.mesh.sizes[axis]}"
                )

            def meaning(group: list[np.ndarray]) -> list[np.ndarray]:
                return op.opdef.group_reference(group, attrs)
        else:
            t = op.operands[0].type
            placement, shape = t.sharding.placements[axis], level_shape(t, axis)

            def meaning(group: list[np.ndarray]) -> list[np.ndarray]:
                return op.opdef.group_reference(group, placement, attrs, shape)
        out: Ranks = [None] * self.mesh.size  # type: ignore[list-item]
        for group in axis_groups(self.mesh, axis):
            for rank, b in zip(group, meaning([blocks[r] for r in group]), strict=True):
                out[rank] = np.asarray(b)
        return out

    def check_placements(self, op: Operation) -> None:
        try:
            check_placements(op, self.mesh)
        except PlacementError as exc:
            raise SimulationError(exc.message) from None


def check_arg_block(param: Value, block: np.ndarray, rank: int) -> None:
    want = local_shape(param.type)
    if tuple(block.shape) != want or block.dtype != param.type.dtype.np_dtype:
        raise ShapeError(
            f"rank {rank}'s block of %{param.name}: {param.type} is {block.dtype}"
            f"{list(block.shape)}, expected {param.type.dtype.np_dtype}{list(want)}"
        )


def check_block(op: Operation, result: Value, block: np.ndarray, rank: int) -> None:
    """A rank's block must have the local shape of the result's type."""
    want = local_shape(result.type)
    if tuple(block.shape) != want or block.dtype != result.type.dtype.np_dtype:
        raise SimulationError(
            f"'{op.name}' gives rank {rank} a {block.dtype}{list(block.shape)} block, but its "
            f"result type {result.type} means {result.type.dtype.np_dtype}{list(want)} per rank: "
            "an op whose attributes name global sizes must first be partitioned per rank"
        )


def run_ranks(module: Module | Function, rank_args: Sequence[Ranks],
              function: str | None = None) -> list[Ranks]:
    """Run a function on per-rank blocks (one list of blocks per argument); its outputs, each as
    per-rank blocks."""
    fn, mesh = _pick(module, function)
    return MeshRun(fn, mesh).run(rank_args)


def simulate(module: Module | Function, *args: np.ndarray, function: str | None = None,
             rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Run a sharded function on global inputs over its simulated mesh: each input is cut to its
    type's placements (partial values into random parts with `rng`), every rank runs, and each
    output is assembled back into its global value."""
    fn, mesh = _pick(module, function)
    if len(args) != len(fn.args):
        raise ShapeError(f"@{fn.name} takes {len(fn.args)} inputs, got {len(args)}")
    arrays = [np.asarray(a) for a in args]
    bind_symbols(fn, arrays)  # global shapes and dtypes checked as the interpreter checks them
    rank_args = [split(a, p.type, mesh, rng) for a, p in zip(arrays, fn.args, strict=True)]
    outs = MeshRun(fn, mesh).run(rank_args)
    return [join(blocks, t) for blocks, t in zip(outs, fn.result_types, strict=True)]


def _pick(module: Module | Function, function: str | None) -> tuple[Function, Mesh]:
    if isinstance(module, Function):
        return module, function_mesh(module)
    only = next(iter(module.functions)) if len(module.functions) == 1 else "main"
    fn = module.functions.get(function or only)
    if fn is None:
        known = ", ".join(f"@{name}" for name in module.functions) or "none"
        raise TilefoldError(f"module has no function @{function or only} (it has: {known})")
    return fn, function_mesh(fn, module)
