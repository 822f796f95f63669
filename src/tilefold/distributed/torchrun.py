"""The torchrun executor: runs a per-rank program (`spmd-partition`'s output) in each process of
a torch.distributed job, the compute compiled by tilefold and each collective done by
torch.distributed over a process group per mesh axis group (gloo on CPU, NCCL for CUDA).

    dist.init_process_group("gloo")                  # under torchrun, or spawned processes
    run = RankProgram(per_rank_module)               # the mesh's axis groups made here
    outputs = run(*this_ranks_blocks)                # NumPy arrays in, NumPy arrays out

The function is cut at its collectives into segments; each segment (the ordinary ops between
two collectives) is its own function, compiled once by `tilefold.compile`; a collective is a
call in `RUNNERS`, keyed by the per-rank op's name. The global rank is the mesh rank (row-major
over the axes, as in the simulator), so process k holds the blocks `scatter` gives rank k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefold.compiler import CompiledGraph
from tilefold.compiler import compile as compile_module
from tilefold.distributed.per_rank import bind_rank
from tilefold.errors import ShapeError, TilefoldError, UnsupportedError
from tilefold.ir import verify
from tilefold.ir.core import Function, Module, Operation, Value
from tilefold.ir.interpreter import bind_symbols
from tilefold.ir.opdef import OPS
from tilefold.ir.ops.rank_collectives import RankCollective
from tilefold.ir.placements import axis_groups
from tilefold.ir.types import Mesh


class ExecutorError(TilefoldError):
    """A per-rank program cannot run on this torch.distributed job as it stands."""


@dataclass
class Group:
    """This process's group along one mesh axis: the torch process group, its global ranks
    in axis order, and this process's index among them."""

    handle: Any
    ranks: list[int]
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class Segment:
    """Ordinary ops between two collectives, compiled as one function."""

    compiled: CompiledGraph
    inputs: list[Value]
    outputs: list[Value]


Runner = Callable[["Comm", np.ndarray, Group, dict[str, Any]], np.ndarray]
RUNNERS: dict[str, Runner] = {}


def runner(name: str) -> Callable[[Runner], Runner]:
    """Register how the per-rank collective `name` runs on torch.distributed."""

    def add(fn: Runner) -> Runner:
        if name not in OPS or not issubclass(OPS[name], RankCollective):
            raise TilefoldError(f"'{name}' is not a per-rank collective")
        RUNNERS[name] = fn
        return fn

    return add


class Comm:
    """Moves NumPy blocks through torch.distributed: to a tensor on the communication device
    (the CPU for gloo, this process's GPU for NCCL) and back."""

    def __init__(self, device: str | None = None):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        if device is None:
            nccl = dist.get_backend() == "nccl"
            device = f"cuda:{torch.cuda.current_device()}" if nccl else "cpu"
        self.device = torch.device(device)

    def tensor(self, x: np.ndarray):
        """A copy of `x` on the device: all_reduce and broadcast write their tensor in place,
        and the program may read the block again (a partial sum used after its reduction)."""
        return self.torch.from_numpy(np.array(x, order="C")).to(self.device)

    def empty(self, shape: Sequence[int], like: np.ndarray):
        dtype = self.torch.from_numpy(np.empty(0, like.dtype)).dtype
        return self.torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def array(self, t) -> np.ndarray:
        return t.cpu().numpy()

    def reduce_op(self, name: str):
        return {"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX}[name]


def _front(x: np.ndarray, dim: int) -> np.ndarray:
    """`x` with dim `dim` first (torch's tensor collectives cut and join dim 0)."""
    return np.ascontiguousarray(np.moveaxis(x, dim, 0))


@runner("spmd.all_reduce")
def _all_reduce(comm: Comm, x: np.ndarray, group: Group, attrs: dict[str, Any]) -> np.ndarray:
    t = comm.tensor(x)
    comm.dist.all_reduce(t, op=comm.reduce_op(attrs["reduce"]), group=group.handle)
    return comm.array(t)


@runner("spmd.all_gather")
def _all_gather(comm: Comm, x: np.ndarray, group: Group, attrs: dict[str, Any]) -> np.ndarray:
    front = _front(x, attrs["dim"])
    out = comm.empty((group.size * front.shape[0], *front.shape[1:]), x)
    gather = (getattr(comm.dist, "all_gather_single", None)
              or comm.dist.all_gather_into_tensor)  # the newer name where torch has it
    gather(out, comm.tensor(front), group=group.handle)
    return np.moveaxis(comm.array(out), 0, attrs["dim"])


@runner("spmd.reduce_scatter")
def _reduce_scatter(comm: Comm, x: np.ndarray, group: Group,
                    attrs: dict[str, Any]) -> np.ndarray:
    front = _front(x, attrs["dim"])
    op = comm.reduce_op(attrs["reduce"])
    if comm.device.type == "cpu":  # gloo has no reduce_scatter: reduce, then keep one block
        t = comm.tensor(front)
        comm.dist.all_reduce(t, op=op, group=group.handle)
        mine = np.split(comm.array(t), group.size, axis=0)[group.index]
    else:
        out = comm.empty((front.shape[0] // group.size, *front.shape[1:]), x)
        scatter = (getattr(comm.dist, "reduce_scatter_single", None)
                   or comm.dist.reduce_scatter_tensor)  # the newer name where torch has it
        scatter(out, comm.tensor(front), op=op, group=group.handle)
        mine = comm.array(out)
    return np.moveaxis(mine, 0, attrs["dim"])


@runner("spmd.all_to_all")
def _all_to_all(comm: Comm, x: np.ndarray, group: Group, attrs: dict[str, Any]) -> np.ndarray:
    front = _front(x, attrs["dim"])  # piece j (along dim) goes to rank j
    out = comm.empty(front.shape, x)
    comm.dist.all_to_all_single(out, comm.tensor(front), group=group.handle)
    pieces = np.split(comm.array(out), group.size, axis=0)  # piece r came from rank r
    return np.concatenate([np.moveaxis(p, 0, attrs["dim"]) for p in pieces],
                          axis=attrs["gather_dim"])


@runner("spmd.local_slice")
def _local_slice(comm: Comm, x: np.ndarray, group: Group, attrs: dict[str, Any]) -> np.ndarray:
    return np.ascontiguousarray(np.split(x, group.size, axis=attrs["dim"])[group.index])


@runner("spmd.broadcast")
def _broadcast(comm: Comm, x: np.ndarray, group: Group, attrs: dict[str, Any]) -> np.ndarray:
    t = comm.tensor(x)
    comm.dist.broadcast(t, src=group.ranks[attrs["root"]], group=group.handle)
    return comm.array(t)


@runner("spmd.permute")
def _permute(comm: Comm, x: np.ndarray, group: Group, attrs: dict[str, Any]) -> np.ndarray:
    n, k, shift = group.size, group.index, attrs["shift"]
    if shift % n == 0:
        return x.copy()
    out = comm.empty(x.shape, x)
    ops = [comm.dist.P2POp(comm.dist.isend, comm.tensor(x), group.ranks[(k + shift) % n],
                           group.handle),
           comm.dist.P2POp(comm.dist.irecv, out, group.ranks[(k - shift) % n], group.handle)]
    for request in comm.dist.batch_isend_irecv(ops):
        request.wait()
    return comm.array(out)


def program_mesh(module: Module, fn: Function) -> Mesh:
    """The mesh a per-rank function runs on: its module's only one; placed types are refused."""
    placed = [v for v in fn.values() if v.type.sharding is not None]
    if placed:
        raise ExecutorError(
            f"@{fn.name} still has placed types (%{placed[0].name}: {placed[0].type}): run "
            "propagate-sharding, expand-redistribute and spmd-partition first"
        )
    if len(module.meshes) != 1:
        named = ", ".join(f"@{m}" for m in module.meshes) or "none"
        raise ExecutorError(f"a per-rank program's module declares exactly one mesh for the "
                            f"runtime to form groups on; this one declares: {named}")
    return next(iter(module.meshes.values()))


def segment_function(ops: list[Operation], inputs: list[Value], outputs: list[Value]
                     ) -> Module:
    """A module whose @main runs `ops` on `inputs` and returns `outputs`."""
    args = [Value(v.type, v.name, None, 0) for v in inputs]
    fn = Function("main", args, [v.type for v in outputs])
    env = dict(zip(inputs, fn.args, strict=True))
    for op in ops:
        copy = Operation(op.opdef, [env[v] for v in op.operands], dict(op.attrs),
                         [r.type for r in op.results], [r.name for r in op.results], loc=op.loc)
        fn.body.append(copy)
        env.update(zip(op.results, copy.results, strict=True))
    fn.body.append(Operation(OPS["return"], [env[v] for v in outputs], {}, [], []))
    return Module(functions=[fn])


def program_steps(fn: Function, mesh: Mesh, compiler: Callable[[Module], CompiledGraph]
                  ) -> list[Segment | Operation]:
    """`fn` cut at its collectives: a compiled `Segment` for each run of ordinary ops whose
    results are read, and each per-rank collective (checked against `mesh`) between them."""
    body = [op for op in fn.ops if not op.has_trait("terminator")]
    steps: list[Segment | Operation] = []
    run: list[Operation] = []

    def close(until: int) -> None:
        if not run:
            return
        made = {r for op in run for r in op.results}
        needed = {v for op in body[until:] for v in op.operands} | set(fn.outputs)
        inputs = list(dict.fromkeys(v for op in run for v in op.operands if v not in made))
        outputs = [r for op in run for r in op.results if r in needed]
        if outputs:  # a run whose results nothing reads is dead code
            steps.append(Segment(compiler(segment_function(run, inputs, outputs)), inputs,
                                 outputs))
        run.clear()

    for i, op in enumerate(body):
        if issubclass(op.opdef, RankCollective):
            close(i)
            check_collective(op, mesh)
            steps.append(op)
        elif op.has_trait("collective"):
            raise ExecutorError(f"'{op.name}' is a global collective: partition the "
                                "function per rank first (passes: spmd-partition)")
        elif op.regions:
            raise ExecutorError(f"'{op.name}' has regions: give the executor the per-rank "
                                "program before fusion (tilefold.compile fuses segments)")
        else:
            run.append(op)
    close(len(body))
    return steps


def check_collective(op: Operation, mesh: Mesh) -> None:
    """A per-rank collective needs a runner, and its axis and size must be the mesh's."""
    if op.name not in RUNNERS:
        raise ExecutorError(f"no torch.distributed runner for '{op.name}' (add one with "
                            "@runner in tilefold/distributed/torchrun.py)")
    attrs = op.opdef.full_attrs(op.attrs)
    if attrs["axis"] not in mesh.names:
        raise ExecutorError(f"'{op.name}' talks over axis {attrs['axis']!r}, which "
                            f"{mesh.declaration()} does not have")
    size = mesh.sizes[mesh.axis_index(attrs["axis"])]
    if attrs["size"] != size:
        raise ExecutorError(f"'{op.name}' says axis {attrs['axis']} has {attrs['size']} "
                            f"devices, but {mesh.declaration()} gives it {size}")


class RankProgram:
    """A per-rank function ready to run in this process of an initialized torch.distributed
    job whose world is the mesh. Every process must build it (process groups are collective)."""

    def __init__(self, module: Module, function: str = "main", *, device: str | None = None,
                 compiler: Callable[[Module], CompiledGraph] = compile_module):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ExecutorError("torch.distributed is not initialized: call "
                                "dist.init_process_group first (torchrun sets the rendezvous)")
        if function not in module.functions:
            raise ExecutorError(f"module has no function @{function}")
        if any(op.name == "spmd.axis_index" for op in module[function].ops):
            module = bind_rank(module, dist.get_rank())  # this process's coordinates
        self.fn = verify(module)[function]
        self.mesh = program_mesh(module, self.fn)
        if dist.get_world_size() != self.mesh.size:
            raise ExecutorError(
                f"{self.mesh.declaration()} has {self.mesh.size} devices, but this job has "
                f"{dist.get_world_size()} processes: launch one process per device"
            )
        for v in self.fn.values():
            if not v.type.is_static:
                raise UnsupportedError(f"the torchrun executor needs static shapes; "
                                       f"%{v.name} is {v.type}")
        self.rank = dist.get_rank()
        self.comm = Comm(device)
        self.groups = self._groups(dist)
        self.steps = program_steps(self.fn, self.mesh, compiler)

    def _groups(self, dist) -> dict[str, Group]:
        """One process group per axis group, made by every process in the same order."""
        mine = {}
        for axis, name in enumerate(self.mesh.names):
            for ranks in axis_groups(self.mesh, axis):
                handle = dist.new_group(ranks)
                if self.rank in ranks:
                    mine[name] = Group(handle, ranks, ranks.index(self.rank))
        return mine

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Run this rank's blocks through the program; its outputs, this rank's blocks."""
        arrays = tuple(np.asarray(a) for a in arrays)
        try:
            bind_symbols(self.fn, list(arrays))
        except TilefoldError as exc:
            raise ShapeError(f"rank {self.rank}: {exc.message}") from None
        env: dict[Value, np.ndarray] = dict(zip(self.fn.args, arrays, strict=True))
        for step in self.steps:
            if isinstance(step, Segment):
                outs = step.compiled(*(env[v] for v in step.inputs))
                env.update(zip(step.outputs, outs, strict=True))
            else:
                attrs = step.opdef.full_attrs(step.attrs)
                group = self.groups[attrs["axis"]]
                env[step.result] = RUNNERS[step.name](self.comm, env[step.operands[0]], group,
                                                       attrs)
        return [env[v] for v in self.fn.outputs]
