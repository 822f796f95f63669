"""Manual templates: Megatron tensor parallelism (column- then row-parallel matmuls, with or
without sequence parallelism) on one mesh axis and data parallelism on the others, or data
parallelism alone; placements follow the function's ops in order.

    matmul(x, w)   x R on tp      -> w S(1)   column-parallel: the result is split on features
                   x split on k   -> w S(0)   row-parallel: the result is P(sum), all_reduced
    add(h, b)      h S(last)      -> b S(0)   the bias of a column-parallel matmul
    anything else                 -> R        norms' weights, row-parallel biases
    (an nn.Linear weight is [out, in], `transpose_b`: column-parallel S(0), row-parallel S(1))
    with Constraints(pad=True), a weight whose split dim does not divide by tp is S(d,pad)
    (a hidden width of 30 on tp=4: blocks of 8, the last with 6 rows and 2 of padding)
    sequence parallel: the data is S(0) on tp; each column-parallel input is gathered to R and
                   each row-parallel result reduce-scattered to S(0) (2 all_gathers + 2
                   reduce_scatters per block instead of 2 all_reduces)
"""

from __future__ import annotations

from tilefold.distributed.cost import CostModel
from tilefold.distributed.plan import Placements, Plan, function
from tilefold.distributed.propagate import placements_of
from tilefold.distributed.rules import result_placements
from tilefold.distributed.strategies.base import (
    Constraints,
    Strategy,
    StrategyError,
    register_strategy,
)
from tilefold.ir import Module
from tilefold.ir.core import Function, Operation, Value
from tilefold.ir.types import (
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    Sharding,
    pad_uneven,
    sharding_problem,
)


def split_on(p: Placement, dim: int) -> bool:
    """Whether `p` shards `dim` (padded or not)."""
    return isinstance(p, Shard) and p.dim == dim


def data_placements(value: Value, mesh: Mesh, axes: list[int]) -> Placements:
    """Dim 0 split over `axes` (in mesh order) as far as it splits evenly, R elsewhere."""
    ps = [Replicate()] * len(mesh.axes)
    for axis in axes:
        ps[axis] = Shard(0)
        if sharding_problem(value.type.with_sharding(Sharding(mesh, tuple(ps)))) is not None:
            ps[axis] = Replicate()
    return tuple(ps)


def weight_dims(op: Operation) -> tuple[int, int]:
    """The contracted and the output-feature dim of a matmul's 2-D weight operand (an
    nn.Linear weight is [out, in]: `transpose_b`)."""
    return (1, 0) if op.attr("transpose_b") else (0, 1)


class Walk:
    """Placements of a function's values as propagate-sharding would give them, the arguments
    placed by a template when their first user is reached."""

    def __init__(self, fn: Function, mesh: Mesh, pad: bool = False):
        self.fn, self.mesh, self.pad = fn, mesh, pad
        self.of: dict[Value, Placements] = {}

    def get(self, v: Value) -> Placements:
        return self.of.get(v, placements_of(v, self.mesh))

    def derive(self, op: Operation) -> Placements:
        if not op.operands:  # a constant or an arange: the same on every device
            ps: Placements = (Replicate(),) * len(self.mesh.axes)
        else:
            derived, _ = result_placements(op, [self.get(v) for v in op.operands])
            ps = tuple(Replicate() if p is None else p for p in derived)
        for r in op.results:
            self.of[r] = ps
        return ps


@register_strategy("megatron")
class Megatron(Strategy):
    """Megatron-LM's tensor parallelism on `axis` (default: "tp", else the last mesh axis),
    data parallel on the other axes."""

    axis_name = "tp"  # the axis it splits weights on when the mesh has several

    def __init__(self, sequence_parallel: bool = False, axis: str | None = None):
        self.sequence_parallel = sequence_parallel
        self.axis = axis

    def search(self, module: Module, mesh: Mesh, cost: CostModel,
               constraints: Constraints) -> Plan:
        fn = function(module, constraints.function)
        name = self.axis or (self.axis_name if self.axis_name in mesh.names
                             else mesh.names[-1])
        tp = mesh.axis_index(name)
        dp = [a for a in range(len(mesh.axes)) if a != tp]
        data = constraints.data_args(fn)
        walk = Walk(fn, mesh, constraints.pad)
        for v in data:
            walk.of[v] = data_placements(v, mesh, dp + ([tp] if self.sequence_parallel else []))
        args = set(fn.args)
        chosen: dict[str, Placements] = {}
        for op in fn.ops:
            if op.has_trait("terminator"):
                continue
            for i, v in enumerate(op.operands):
                if v in args and v not in walk.of:
                    walk.of[v] = self.weight(op, i, walk, tp)
            if self.sequence_parallel and self.column(op, walk, tp, args):
                x = op.operands[0]
                gathered = tuple(Replicate() if a == tp else p
                                 for a, p in enumerate(walk.get(x)))
                walk.of[x] = chosen[x.name] = gathered
            ps = walk.derive(op)
            if self.sequence_parallel and op.name == "matmul" and isinstance(ps[tp], Partial):
                scattered = tuple(Shard(0) if a == tp else p for a, p in enumerate(ps))
                if sharding_problem(op.result.type.with_sharding(Sharding(mesh, scattered))):
                    raise StrategyError(f"sequence parallel: %{op.result.name} "
                                        f"{op.result.type} does not split on dim 0 over {name}")
                walk.of[op.result] = chosen[op.result.name] = scattered
        placed = [(a.name, walk.get(a)) for a in fn.args]
        inner = [(n, ps) for n, ps in chosen.items() if n not in {a.name for a in fn.args}]
        strategy = "megatron-sp" if self.sequence_parallel else "megatron"
        return Plan(mesh, tuple(placed + inner), strategy, fn.name)

    @staticmethod
    def column(op: Operation, walk: Walk, tp: int, args: set[Value]) -> bool:
        """A matmul whose weight is column-parallel (its activation is needed whole)."""
        w = op.operands[1] if op.name == "matmul" else None
        return (w in args and w.type.rank == 2
                and split_on(walk.get(w)[tp], weight_dims(op)[1]))

    @staticmethod
    def weight(op: Operation, i: int, walk: Walk, tp: int) -> Placements:
        """The template's placement of argument operand `i` of `op`."""
        mesh = walk.mesh
        v = op.operands[i]
        x = walk.get(op.operands[0]) if i else None
        place = Replicate()
        if op.name == "matmul" and i == 1 and v.type.rank == 2 and x is not None:
            k = op.operands[0].type.rank - 1
            inner, outer = weight_dims(op)
            if isinstance(x[tp], Shard) and x[tp].dim == k:
                place = Shard(inner)  # row-parallel
            elif not isinstance(x[tp], Partial):
                place = Shard(outer)  # column-parallel (SP: its input is gathered first)
        elif (op.name == "add" and i == 1 and v.type.rank == 1 and x is not None
              and split_on(x[tp], op.operands[0].type.rank - 1)):
            place = Shard(0)  # the bias of a column-parallel matmul
        ps = tuple(place if a == tp else Replicate() for a in range(len(mesh.axes)))
        placed = v.type.with_sharding(Sharding(mesh, ps))
        if walk.pad:
            placed = pad_uneven(placed)
        if sharding_problem(placed) is not None:
            return (Replicate(),) * len(mesh.axes)
        return placed.sharding.placements


@register_strategy("megatron-sp")
class MegatronSP(Megatron):
    """Megatron tensor parallelism with sequence parallelism between the blocks."""

    def __init__(self, axis: str | None = None):
        super().__init__(sequence_parallel=True, axis=axis)


@register_strategy("dp")
class DataParallel(Strategy):
    """Every mesh axis splits the batch (dim 0 of the data arguments); weights replicated."""

    def search(self, module: Module, mesh: Mesh, cost: CostModel,
               constraints: Constraints) -> Plan:
        fn = function(module, constraints.function)
        data = set(constraints.data_args(fn))
        axes = list(range(len(mesh.axes)))
        entries = tuple((a.name, data_placements(a, mesh, axes) if a in data
                         else (Replicate(),) * len(axes)) for a in fn.args)
        return Plan(mesh, entries, "dp", fn.name)
