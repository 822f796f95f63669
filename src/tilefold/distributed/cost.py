"""Cost models for sharded programs: what an op, a collective, a redistribute and a whole
partitioned function cost per device, each estimate with its breakdown; `AlphaBeta` is the
roofline-plus-alpha-beta model with link classes per mesh axis.

    ring all_reduce of B bytes over t devices:  2(t-1) steps, 2(t-1)/t * B bytes moved each
    all_gather / reduce_scatter / all_to_all:     t-1 steps,    (t-1)/t * B
    time of a collective = steps * alpha + bytes moved * beta        (alpha, beta of the axis)
    time of an op        = max(flops / peak flops, bytes touched / memory bandwidth)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache

from tilefold.codegen.lower import op_flops as flops_per_element
from tilefold.errors import PassError, TilefoldError
from tilefold.ir.core import Function, Operation
from tilefold.ir.types import (
    Mesh,
    Placement,
    Replicate,
    Shard,
    TensorType,
    local_shape,
)
from tilefold.passes.expand_redistribute import Step, redistribute_paths, redistribute_steps
from tilefold.target.gpu import GPU_TARGETS, GPUTarget


class CostModelError(TilefoldError):
    """A cost model was asked about something it cannot price (an unknown axis or link)."""


@dataclass(frozen=True)
class DeviceSpec:
    """One device's roofline: peak flop rate, memory bandwidth (bytes/s) and memory (bytes)."""

    name: str
    flops: float
    bandwidth: float
    memory: int


@dataclass(frozen=True)
class Link:
    """An alpha-beta link class: `alpha` seconds per message step, `beta` seconds per byte."""

    name: str
    alpha: float
    beta: float


def device_spec(gpu: GPUTarget) -> DeviceSpec:
    """The roofline of a GPU chip from its entry in `target/gpu.py` (the one hardware model)."""
    if gpu.matrix_tflops is None or gpu.memory_bandwidth_gbps is None or gpu.memory_bytes is None:
        raise CostModelError(f"{gpu} is an architecture, not a chip: it has no peak figures")
    return DeviceSpec(gpu.name, gpu.matrix_tflops * 1e12, gpu.memory_bandwidth_gbps * 1e9,
                      gpu.memory_bytes)


# Every GPU chip tilefold knows, and a nominal CPU node (the gloo runtime's: it prices only
# collectives that matter, so its figures are round ones, not a measured machine's).
DEVICES = {
    **{name: device_spec(gpu) for name, gpu in GPU_TARGETS.items() if gpu.sm_count is not None},
    "cpu": DeviceSpec("cpu", 1e12, 50e9, 64 << 30),
}
LINKS = {
    "nvlink": Link("nvlink", 3e-6, 1 / 150e9),  # per direction, within a node
    "ib": Link("ib", 10e-6, 1 / 25e9),  # 200 Gb/s per device, between nodes
    "gloo": Link("gloo", 50e-6, 1 / 2e9),  # TCP over loopback or ethernet
}
NODE = 8  # devices per node: mesh axes whose span fits in one node default to nvlink


@dataclass(frozen=True)
class Item:
    """One line of a breakdown: what, its kind (compute or a collective), work, time."""

    what: str
    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class Estimate:
    """A cost with its breakdown; estimates add, and print as a table."""

    items: tuple[Item, ...] = ()

    @property
    def seconds(self) -> float:
        return math.fsum(i.seconds for i in self.items)

    @property
    def comm_bytes(self) -> float:
        """Bytes each device sends over the collectives in the estimate."""
        return math.fsum(i.bytes for i in self.items if i.kind != "compute")

    @property
    def flops(self) -> float:
        return math.fsum(i.flops for i in self.items)

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.items + other.items)

    def scaled(self, factor: float, note: str) -> Estimate:
        """Every item times `factor` (a backward pass, repeated layers), its name noted."""
        return Estimate(tuple(Item(f"{i.what} {note}", i.kind, i.flops * factor,
                                   i.bytes * factor, i.seconds * factor) for i in self.items))

    def by_kind(self) -> dict[str, Item]:
        """The items summed per kind."""
        out: dict[str, Item] = {}
        for i in self.items:
            o = out.get(i.kind, Item(i.kind, i.kind))
            out[i.kind] = Item(i.kind, i.kind, o.flops + i.flops, o.bytes + i.bytes,
                               o.seconds + i.seconds)
        return out

    def table(self, detail: bool = False) -> str:
        """Rows per kind (or per item with `detail`), then the total."""
        rows = list(self.items if detail else self.by_kind().values())
        rows.append(Item("total", "", self.flops, self.comm_bytes, self.seconds))
        width = max([len(r.what) for r in rows] + [4])
        kind = max([len(r.kind) for r in rows] + [4])
        lines = [f"{'what':<{width}}  {'kind':<{kind}}  {'GFLOP':>10}  {'MB moved':>10}  "
                 f"{'ms':>10}"]
        for r in rows:
            lines.append(f"{r.what:<{width}}  {r.kind:<{kind}}  {r.flops / 1e9:>10.3f}  "
                         f"{r.bytes / 1e6:>10.3f}  {r.seconds * 1e3:>10.4f}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def nbytes(t: TensorType) -> int:
    """Bytes of the block of `t` that each device holds."""
    return math.prod(local_shape(t)) * t.dtype.bits // 8


FREE = frozenset({"reshape", "expand_dims", "squeeze"})  # views: no work, no traffic


def op_flops(op: Operation) -> float:
    """Flops one device spends on `op` with its operands' local blocks."""
    out = local_shape(op.result.type)
    if op.name == "matmul":
        a = local_shape(op.operands[0].type)
        k = a[0] if len(a) == 1 else a[-2] if op.attr("transpose_a") else a[-1]
        return 2.0 * math.prod(out) * k
    if op.name == "scaled_dot_product_attention":
        q, k = (local_shape(v.type) for v in op.operands[:2])
        return 2.0 * math.prod(out[:-1]) * k[-2] * (q[-1] + out[-1])
    return float(flops_per_element(op.name) * math.prod(out))  # the lowering table's


def after_step(t: TensorType, op: str, axis: str, attrs: dict) -> TensorType:
    """The type a one-axis collective gives `t`."""
    p: Placement = Shard(attrs["dim"], attrs.get("pad", False)) if "dim" in attrs else Replicate()
    return t.with_sharding(t.sharding.replace(t.sharding.mesh.axis_index(axis), p))


def steps(t: TensorType, target: tuple[Placement, ...]) -> list[Step]:
    """expand-redistribute's path for `t`, its paths found once per shape class: a path
    depends on the shape only through which mesh sizes divide each dim, i.e. through
    gcd(dim, mesh size)."""
    if not t.is_static:
        return redistribute_steps(t, target)
    n = t.sharding.mesh.size
    canonical = t.with_shape([math.gcd(d, n) for d in t.shape]).with_sharding(t.sharding)
    paths = _paths(canonical)
    if target not in paths:
        raise PassError(f"expand-redistribute: no collectives take {t} to "
                        f"{list(map(str, target))}")
    return paths[target]


@lru_cache(maxsize=1 << 14)
def _paths(t: TensorType) -> dict[tuple[Placement, ...], list[Step]]:
    return redistribute_paths(t)


def collective_bytes(op: str, before: TensorType, after: TensorType) -> int:
    """The per-device buffer B a collective is priced on: the gathered block for all_gather,
    the operand's block otherwise."""
    return nbytes(after) if op == "all_gather" else nbytes(before)


class CostModel(ABC):
    """What a sharded program costs on a mesh; each method returns an `Estimate`."""

    name: str = ""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh

    @abstractmethod
    def compute(self, op: Operation) -> Estimate:
        """One device's time for an ordinary op on its blocks."""

    @abstractmethod
    def collective(self, kind: str, nbytes: float, axis: str, what: str = "") -> Estimate:
        """A collective `kind` over mesh axis `axis` on a per-device buffer of `nbytes`."""

    def redistribute(self, t: TensorType, target: tuple[Placement, ...],
                     what: str = "") -> Estimate:
        """The collectives expand-redistribute makes of taking `t` to `target`."""
        total = Estimate()
        if t.sharding is None or t.sharding.placements == tuple(target):
            return total
        for step in steps(t, tuple(target)):
            new = after_step(t, step.op, step.axis, step.attrs)
            total += self.collective(step.op, collective_bytes(step.op, t, new), step.axis, what)
            t = new
        return total

    def peak_memory(self, fn: Function) -> int:
        """The most bytes one device holds at once running `fn`: its arguments throughout,
        each result from its op to its last use."""
        last: dict[object, int] = {}
        ops = fn.ops
        for i, op in enumerate(ops):
            for v in op.operands:
                last[v] = i
        live = sum(nbytes(a.type) for a in fn.args)
        peak = live
        alive: dict[object, int] = {}
        for i, op in enumerate(ops):
            for r in op.results:
                if r.type.is_static and op.name not in FREE:
                    alive[r] = nbytes(r.type)
            peak = max(peak, live + sum(alive.values()))
            for v in [v for v in alive if last.get(v, -1) <= i]:
                del alive[v]
        return peak

    def op(self, op: Operation) -> Estimate:
        """One op of a placed function: a collective, a redistribute's collectives, or an
        ordinary op's compute (nothing for views and the terminator)."""
        if op.has_trait("terminator") or op.name in FREE:
            return Estimate()
        what = f"%{op.results[0].name} {op.name}"
        if op.name == "redistribute":
            return self.redistribute(op.operands[0].type, op.result.type.sharding.placements,
                                     what)
        if op.has_trait("collective"):
            before, after = op.operands[0].type, op.result.type
            return self.collective(op.name, collective_bytes(op.name, before, after),
                                   op.attr("axis"), what)
        return self.compute(op)

    def estimate(self, fn: Function, training: bool = False) -> Estimate:
        """A partitioned function's cost per device: its ops' compute plus its collectives;
        with `training`, a backward pass (twice the compute, each collective's conjugate of
        the same size) and the gradient all_reduces of replicated arguments."""
        total = Estimate()
        for op in fn.ops:
            total += self.op(op)
        if not training:
            return total
        backward = Estimate(tuple(
            Item(f"{i.what} (backward)", i.kind, 2 * i.flops, i.bytes, 2 * i.seconds)
            if i.kind == "compute" else Item(f"{i.what} (backward)", i.kind, i.flops, i.bytes,
                                             i.seconds) for i in total.items))
        return total + backward + self.gradient_reductions(fn)

    def gradient_reductions(self, fn: Function) -> Estimate:
        """An argument replicated on an axis whose ops see different data there (an operand or
        result split on a letter the argument lacks) gets partial gradients: all_reduce them."""
        from tilefold.distributed.rules import rule_for  # rules import nothing from here

        total = Estimate()
        args = set(fn.args)
        for op in fn.ops:
            einsum = rule_for(op) if not op.has_trait("sharding") else None
            if einsum is None:
                continue
            for i, v in enumerate(op.operands):
                if v not in args or v.type.sharding is None:
                    continue
                for axis in split_elsewhere(einsum, op, i):
                    total += self.collective("all_reduce", nbytes(v.type), axis,
                                             f"grad %{v.name}")
        return total


def split_elsewhere(einsum, op: Operation, i: int) -> list[str]:
    """The mesh axes where operand `i` is replicated but the op works on split data that
    operand `i`'s letters do not index."""
    own = set(einsum.inputs[i])
    mesh = op.operands[i].type.sharding.mesh
    axes = []
    for axis, name in enumerate(mesh.names):
        if mesh.sizes[axis] == 1 or op.operands[i].type.sharding.placements[axis] != Replicate():
            continue
        for index, t in [*zip(einsum.inputs, (v.type for v in op.operands), strict=True),
                         (einsum.output, op.result.type)]:
            p = t.sharding.placements[axis] if t.sharding is not None else Replicate()
            if isinstance(p, Shard) and index[p.dim] not in own:
                axes.append(name)
                break
    return axes


@dataclass
class AlphaBeta(CostModel):
    """Roofline compute on `device`; collectives over each mesh axis priced with that axis's
    link class (by default nvlink while the axis and those after it fit in one node, else ib)."""

    mesh: Mesh
    device: DeviceSpec = field(default_factory=lambda: DEVICES["h100"])
    links: dict[str, Link] = field(default_factory=dict)
    name: str = "alpha-beta"

    def __post_init__(self) -> None:
        links = dict(self.links)
        for axis, name in enumerate(self.mesh.names):
            if name not in links:
                span = math.prod(self.mesh.sizes[axis:])
                links[name] = LINKS["nvlink" if span <= NODE else "ib"]
            elif isinstance(links[name], str):
                links[name] = link(links[name])
        unknown = set(links) - set(self.mesh.names)
        if unknown:
            raise CostModelError(f"links name axes {sorted(unknown)} that "
                                 f"{self.mesh.declaration()} does not have")
        self.links = links

    def compute(self, op: Operation) -> Estimate:
        flops = op_flops(op)
        moved = sum(nbytes(v.type) for v in [*op.operands, *op.results] if v.type.is_static)
        seconds = max(flops / self.device.flops, moved / self.device.bandwidth)
        return Estimate((Item(f"%{op.results[0].name} {op.name}", "compute", flops, 0.0,
                              seconds),))

    def collective(self, kind: str, nbytes: float, axis: str, what: str = "") -> Estimate:
        if axis not in self.links:
            raise CostModelError(f"collective {kind} over axis {axis!r}: "
                                 f"{self.mesh.declaration()} has no such axis")
        t = self.mesh.sizes[self.mesh.axis_index(axis)]
        steps, moved = ring(kind, nbytes, t)
        lk = self.links[axis]
        return Estimate((Item(what or kind, f"{kind}@{axis}", 0.0, moved,
                              steps * lk.alpha + moved * lk.beta),))


def ring(kind: str, nbytes: float, t: int) -> tuple[int, float]:
    """(message steps, bytes moved per device) of collective `kind` on `t` devices, ring
    algorithms, for a per-device buffer of `nbytes`."""
    if t == 1 or kind == "local_slice":
        return 0, 0.0
    if kind == "all_reduce":
        return 2 * (t - 1), 2 * (t - 1) * nbytes / t
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return t - 1, (t - 1) * nbytes / t
    if kind == "broadcast":
        return t - 1, float(nbytes)
    if kind == "permute":
        return 1, float(nbytes)
    raise CostModelError(f"no alpha-beta price for collective {kind!r}; known: all_reduce, "
                         "all_gather, reduce_scatter, all_to_all, broadcast, permute, "
                         "local_slice")


def link(name: str) -> Link:
    """The link class `name`; "measured" is what `tilefold tune --comm` fitted on this machine
    (2 gloo ranks)."""
    if name == "measured":
        from tilefold.distributed.calibrate import measured

        cal = measured()
        if cal is None:
            raise CostModelError("no measured link on this machine: run `tilefold tune --comm`")
        return Link("measured", cal.alpha, cal.beta)
    if name not in LINKS:
        raise CostModelError(f"unknown link class {name!r}; known: {', '.join(LINKS)}, "
                             "measured")
    return LINKS[name]
