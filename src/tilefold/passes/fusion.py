"""Fusion: groups ops into `fused` regions that one kernel each implements, and says why not.

Two families (DESIGN.md, "Fusion"):
- compute: a matmul, the layout/cast/dequantize ops feeding its operands (prologues) and the
  elementwise ops and row reductions applied to its result (epilogues);
- memory: chains of elementwise ops and reductions over one iteration space (softmax,
  layer_norm, rms_norm, residual adds, ...).

What the target's kernels can hold (which ops start a compute group, which prologues a GEMM
takes, which reductions its epilogue may hold) is the backend's fusion policy
(`passes/fusion_policy.py`, `fusion{backend=NAME}`; the CPU's by default).

Only ops with the `lowered` trait join groups: their IR declaration says codegen's op-lowering
table (`codegen/lower/rules.py`) has a rule for them, so no group reaches codegen holding an op
no kernel can compute. What may join a group is decided by how the ops line dims up
(`tilefold.ir.axes`, as the kernels read them), not by comparing shapes: with M == N, an [M]
row result and an [N] bias have the same shape, yet NumPy broadcasts both along the last axis
of C.

Every refused fusion is recorded with its reason (as Inductor's WhyNoFuse) in `refusals`, logged
on `tilefold.passes` and shown by `tilefold explain`.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field

from tilefold.errors import PassError, UnsupportedError
from tilefold.ir import OPS, Block, Function, Operation, Value
from tilefold.ir.axes import AxisClasses
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.fusion_policy import FusionPolicy, fusion_policy
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter

log = logging.getLogger("tilefold.passes")


@dataclass(frozen=True)
class Refusal:
    """A fusion that was considered and refused: the producer group, the consumer, why."""

    producer: str
    consumer: str
    reason: str

    def __str__(self) -> str:
        return f"not fusing {self.consumer} into {self.producer}: {self.reason}"


@dataclass
class Group:
    """Ops becoming one fused region, in program order."""

    ops: list[Operation]
    kind: str
    space: Value  # the value spanning the group's iteration space (C of a GEMM)
    compute: Operation | None = None  # a compute group's GEMM
    axes: tuple[int, ...] | None = None  # reduction axes of the domain, once a reduction joined
    members: set[Operation] = field(default_factory=set)
    position: int = 0  # in the planner's list of groups (started later: larger)

    def __post_init__(self) -> None:
        self.members = set(self.ops)

    @property
    def domain(self) -> tuple:
        return tuple(self.space.type.shape)

    def spatial_ops(self) -> list[Operation]:
        """The ops over the iteration space: all but a compute group's matmul and prologues."""
        if self.kind != "compute":
            return self.ops
        return self.ops[self.ops.index(self.compute) + 1:]

    def add(self, op: Operation) -> None:
        self.ops.append(op)
        self.members.add(op)

    @property
    def label(self) -> str:
        return f"group of %{self.ops[0].results[0].name} ({self.kind})"

    def inputs(self) -> list[Value]:
        seen: list[Value] = []
        for op in self.ops:
            for v in op.operands:
                if v.defining_op not in self.members and v not in seen:
                    seen.append(v)
        return seen


def _describe(op: Operation) -> str:
    return f"%{op.results[0].name} ({op.name})" if op.results else op.name


def _patterns(rank: int, axes: tuple[int, ...] | None) -> list[tuple[int | None, ...]]:
    """How a group value's dims may face the space's axes: all of them, or (once the group
    reduces `axes`) the others with the reduced ones kept as 1 (None) or dropped."""
    full = tuple(range(rank))
    if axes is None:
        return [full]
    return [full, tuple(None if a in axes else a for a in full),
            tuple(a for a in full if a not in axes)]


class _Lineup:
    """Which axis of a group's space each dim of its values indexes, after `op` joins."""

    def __init__(self, group: Group, op: Operation):
        self.classes = AxisClasses()
        for o in (*group.spatial_ops(), op):
            self.classes.align(o)  # UnsupportedError: the op maps no dims one to one
        self.space = group.space
        self.domain = group.domain
        self.axis_of = {self.classes.find((self.space, j)): j for j in range(len(self.domain))}

    def collapsed(self) -> bool:
        """Whether two axes of the space now line up with each other."""
        return len(self.axis_of) < len(self.domain)

    def faces(self, v: Value, pattern: tuple[int | None, ...]) -> bool:
        """Whether dim j of `v` indexes axis pattern[j] of the space (None: v is 1 there); a
        size-1 dim only needs the size to match."""
        shape = tuple(v.type.shape)
        if len(shape) != len(pattern):
            return False
        for j, (d, a) in enumerate(zip(shape, pattern, strict=True)):
            one = isinstance(d, int) and d == 1
            if (a is None and not one) or (a is not None and d != self.domain[a]):
                return False
            if a is not None and not one and self.axis_of.get(self.classes.find((v, j))) != a:
                return False
        return True


class Planner:
    """Partitions one function's ops into groups (legality rules in `why_not`; what the
    backend's kernels can hold, in `policy`)."""

    def __init__(self, fn: Function, max_ops: int, max_inputs: int, max_row: int,
                 policy: FusionPolicy):
        self.fn = fn
        self.policy = policy
        self.rewriter = Rewriter(fn)
        self.max_ops = max_ops
        self.max_inputs = max_inputs
        self.max_row = max_row
        self.group_of: dict[Operation, Group] = {}
        # Program order (a topological order) of the ops planned; prologue copies made while
        # planning have none and are walked through
        self.order = {op: i for i, op in enumerate(fn.ops)}
        self.groups: list[Group] = []
        self.refusals: list[Refusal] = []
        self.users = fn.uses()

    def refuse(self, group: Group, op: Operation, reason: str) -> None:
        refusal = Refusal(group.label, _describe(op), reason)
        self.refusals.append(refusal)
        log.info("fusion: %s", refusal)

    def plan(self) -> list[Group]:
        for op in list(self.fn.ops):  # clone_before inserts prologue copies as we go
            if self.policy.starts_compute(op):
                self.start(op, "compute").compute = op
                self.absorb_prologues(op)
            elif op.has_trait("lowered"):  # the lowering table has a rule for it
                self.join_or_start(op)
            elif op.name not in ("constant", "return"):
                reason = (
                    "a layout op changes the iteration space; it runs as its own step"
                    if op.has_trait("layout") else
                    f"'{op.name}' has no kernel lowering rule (codegen/lower/rules.py)"
                    if op.has_trait("elementwise") or op.has_trait("reduction") else
                    f"'{op.name}' is not fusible"
                )
                for group in self.producer_groups(op):
                    self.refuse(group, op, reason)
        return [g for g in self.groups if g.ops]

    def start(self, op: Operation, kind: str) -> Group:
        group = Group([op], kind, op.results[0], position=len(self.groups))
        if op.has_trait("reduction"):
            group.space = op.operands[0]
            group.axes = op.reduced_axes()
        self.groups.append(group)
        self.group_of[op] = group
        return group

    def producer_groups(self, op: Operation) -> list[Group]:
        """Groups defining `op`'s operands, compute groups first, latest first."""
        found = []
        for v in op.operands:
            group = self.group_of.get(v.defining_op)
            if group is not None and group not in found:
                found.append(group)
        return sorted(found, key=lambda g: (g.kind != "compute", -g.position))

    def join_or_start(self, op: Operation) -> None:
        producers = self.producer_groups(op)
        for group in producers:
            reason = self.why_not(group, op)
            if reason is None:
                group.add(op)
                self.group_of[op] = group
                if op.has_trait("reduction"):
                    group.axes = op.reduced_axes()
                for other in producers:
                    if other is not group:
                        self.merge_siblings(group, other)
                return
            self.refuse(group, op, reason)
        self.start(op, "memory")

    def merge_siblings(self, group: Group, other: Group) -> None:
        """Take `other`, an elementwise group over the same space that also feeds the op just
        joined to `group`, into `group` (an optimizer's update: the decayed parameter and the
        moving averages, each a chain of its own from the arguments, meet in one op)."""
        if not (group.kind == other.kind == "memory" and group.axes is None
                and other.axes is None and group.domain == other.domain != ()):
            return
        reason = self.why_not_merge(group, other)
        if reason is not None:
            self.refuse(group, other.ops[0], reason)
            return
        merged = sorted(group.ops + other.ops, key=lambda o: self.order.get(o, -1))
        group.ops, group.members = merged, set(merged)
        for o in other.ops:
            self.group_of[o] = group
        other.ops, other.members = [], set()

    def why_not_merge(self, group: Group, other: Group) -> str | None:
        """Why the sibling groups may not become one (None: they may)."""
        if len(group.ops) + len(other.ops) > self.max_ops:
            return f"merging the sibling groups passes the size limit of {self.max_ops} ops"
        inside = self.defined_in(group) | self.defined_in(other)
        outside = {*group.inputs(), *other.inputs()} - inside
        if len(outside) > self.max_inputs:
            return f"the merged siblings would take more than {self.max_inputs} inputs"
        if any(o.has_trait("reduction") for o in group.ops + other.ops):
            return "a sibling group reduces"
        if any(self.depends_on(v, g) for v in outside for g in (group, other)):
            return "one sibling group is computed from the other outside them: a cycle"
        return None

    def why_not(self, group: Group, op: Operation) -> str | None:
        """Why `op` may not join `group` (None: it may)."""
        if len(group.ops) >= self.max_ops:
            return f"the group has reached the size limit of {self.max_ops} ops"
        if len({*group.inputs(), *op.operands} - self.defined_in(group)) > self.max_inputs:
            return f"the fused kernel would take more than {self.max_inputs} inputs"
        reason = self.why_not_shapes(group, op)
        if reason is not None:
            return reason
        for v in op.operands:
            producer = v.defining_op
            if producer not in group.members and self.depends_on(v, group):
                return f"%{v.name} is computed from the group outside it: fusing makes a cycle"
        return None

    def why_not_shapes(self, group: Group, op: Operation) -> str | None:
        """Why `op`'s dims do not line up with the group's iteration space (None: they do)."""
        result = op.results[0]
        shape = tuple(result.type.shape)
        if op.has_trait("reduction") and op.operands[0].defining_op not in group.members:
            return "the reduced operand comes from outside the group"
        try:
            lineup = _Lineup(group, op)
        except UnsupportedError as exc:
            return exc.message
        if lineup.collapsed():
            return (f"it lines two axes of the group's space {_shape(group.domain)} up with "
                    "each other (NumPy aligns a keepdims=false row result with the last axis, "
                    "not the rows)")
        if op.has_trait("reduction"):
            axes = op.reduced_axes()
            source = tuple(op.operands[0].type.shape)
            if not lineup.faces(op.operands[0], tuple(range(len(group.domain)))):
                return f"it reduces {_shape(source)}, not the group's space {_shape(group.domain)}"
            if group.axes is not None and axes != group.axes:
                return f"it reduces axes {list(axes)}, the group reduces {list(group.axes)}"
            if group.kind == "compute" and (reason := self.policy.why_not_epilogue_reduction(
                    axes, source, self.max_row)):
                return reason
            if axes and axes != tuple(range(axes[0], len(source))):
                return f"axes {list(axes)} are not trailing axes (only row reductions fuse)"
            return None
        if not any(lineup.faces(result, p) for p in _patterns(len(group.domain), group.axes)):
            return (f"its result {_shape(shape)} does not line up with the group's space "
                    f"{_shape(group.domain)}")
        return None

    def defined_in(self, group: Group) -> set[Value]:
        return {r for op in group.ops for r in op.results}

    def depends_on(self, value: Value, group: Group) -> bool:
        """Whether `value` is computed (transitively) from a result of `group`, as the fused
        kernels will run: a value of another group is ready only when that whole group has
        run, so the walk goes on from all of that group's inputs (op by op, a group that
        takes one of `group`'s results beside an op `group` needs would look independent:
        a cycle of kernels). The walk stops at ops before the group's first member in
        program order: nothing they are computed from comes after it (a prologue copy in
        the group feeds only its GEMM)."""
        first = min((self.order[op] for op in group.members if op in self.order), default=-1)
        stack, seen = [value], set()
        while stack:
            producer = stack.pop().defining_op
            if producer is None or producer in seen or self.order.get(producer, first) < first:
                continue
            if producer in group.members:
                return True
            seen.add(producer)
            other = self.group_of.get(producer)
            stack.extend(producer.operands if other is None or other is group
                         else other.inputs())
        return False

    def absorb_prologues(self, matmul: Operation) -> None:
        group = self.group_of[matmul]
        for v in matmul.operands:
            producer = v.defining_op
            if producer is None or producer.name not in self.policy.prologue_ops:
                continue
            owner = self.group_of.get(producer)
            users = {u for u in self.users.get(v, []) if u is not matmul}
            if owner is not None and len(owner.ops) > 1:
                self.refuse(group, producer, "it already belongs to a larger memory-bound group")
            elif users and producer.name not in self.policy.free_prologues:
                self.refuse(group, producer, f"%{v.name} has other users; computing it per "
                            "GEMM operand would repeat the conversion")
            elif users:
                self.take(group, self.clone_before(producer, matmul), matmul)
            else:
                if owner is not None:
                    self.groups.remove(owner)
                    del self.group_of[producer]
                self.take(group, producer, matmul)

    def take(self, group: Group, prologue: Operation, matmul: Operation) -> None:
        group.ops.insert(0, prologue)
        group.members.add(prologue)
        self.group_of[prologue] = group

    def clone_before(self, op: Operation, user: Operation) -> Operation:
        """A copy of the free prologue `op` for `user` alone (the original keeps its users)."""
        copy = Operation(op.opdef, op.operands, op.attrs, [r.type for r in op.results],
                         [self.rewriter.fresh_name() for _ in op.results], loc=op.loc)
        block = user.parent
        block.insert(block.ops.index(user), copy)
        user.operands = [copy.results[0] if v is op.results[0] else v for v in user.operands]
        return copy


def fold_row_reshapes(fn: Function, rewriter: Rewriter) -> int:
    """`reshape(matmul(reshape(x, [M, K]), w), [..., N])` -> `matmul(x, w)` when the reshapes
    only merge and split x's leading dims (a linear layer on [batch, seq, K] written as 2-D),
    so that the GEMM and its epilogue see one iteration space. Returns the number folded."""
    folded = 0
    uses = fn.uses()
    for mm in list(fn.ops):
        if mm.name != "matmul" or mm.attr("transpose_a"):
            continue
        (a, w), (y,) = mm.operands, mm.results
        inner, users = a.defining_op, uses.get(y, [])
        if (inner is None or inner.name != "reshape" or a.type.rank != 2 or w.type.rank != 2
                or len(users) != 1 or users[0].name != "reshape"):
            continue
        x, z = inner.operands[0], users[0].results[0]
        if (x.type.rank < 2 or tuple(x.type.shape[:-1]) != tuple(z.type.shape[:-1])
                or x.type.shape[-1] != a.type.shape[-1] or z.type.shape[-1] != y.type.shape[-1]):
            continue
        new = rewriter.create(users[0], "matmul", [x, w], dict(mm.attrs), loc=mm.loc)
        rewriter.replace(users[0], new.results)
        folded += 1
    rewriter.erase_dead()
    return folded


def _shape(shape: tuple) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def outline(fn: Function, groups: list[Group], rewriter: Rewriter) -> list[Operation]:
    """Replace each group's ops by one `fused` op whose region holds them (all groups in one
    sweep: a use table built once, one rename and one reordering of the block)."""
    uses = fn.uses()
    block = fn.body
    renamed: dict[Value, Value] = {}
    fused_at: dict[Operation, Operation] = {}  # a group's last op -> its fused op
    members: set[Operation] = set()
    made = []
    for group in groups:
        inputs = group.inputs()
        outputs = [r for op in group.ops for r in op.results
                   if any(u not in group.members for u in uses.get(r, []))]
        region = Block()
        mapping = {v: region.add_arg(Value(v.type, rewriter.fresh_name(), None, 0))
                   for v in inputs}
        for op in group.ops:
            op.operands = [mapping.get(v, v) for v in op.operands]
            region.append(op)
        region.append(Operation(OPS["yield"], outputs, {}, [], []))
        fused = Operation(
            OPS["fused"], inputs, {"kind": group.kind}, [v.type for v in outputs],
            [rewriter.fresh_name() for _ in outputs], regions=[region], loc=group.ops[0].loc,
        )
        fused.parent = block
        renamed.update(zip(outputs, fused.results, strict=True))
        fused_at[group.ops[-1]] = fused
        members |= group.members
        made.append(fused)
    order = []
    for op in block.ops:
        if op in fused_at:
            order.append(fused_at[op])
        elif op not in members:
            order.append(op)
    block.ops = order
    for op in block.ops:  # the group results outside their group: now the fused ops'
        op.operands = [renamed.get(v, v) for v in op.operands]
    _schedule(block)
    return made


def _schedule(block: Block) -> None:
    """Reorder `block` topologically, keeping the existing order wherever it is legal."""
    ops = block.ops
    producer = {r: i for i, op in enumerate(ops) for r in op.results}
    waiting = [{producer[v] for v in op.operands if v in producer} for op in ops]
    users: list[list[int]] = [[] for _ in ops]
    for i, deps in enumerate(waiting):
        for d in deps:
            users[d].append(i)
    ready = [i for i, deps in enumerate(waiting) if not deps]
    heapq.heapify(ready)
    order: list[Operation] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(ops[i])
        for u in users[i]:
            waiting[u].discard(i)
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(order) != len(ops):  # the planner's cycle checks failed: never drop ops silently
        raise PassError("fusion: the fused regions depend on each other in a cycle")
    block.ops = order


@register_pass
class Fusion(Pass):
    """Group GEMMs with prologues/epilogues and memory-bound chains into fused regions.

    Each group is outlined into a `fused` region; `refusals` lists what it declined and why."""

    options = (
        Option("max-ops", int, 32, "most ops in one fused region"),
        Option("max-inputs", int, 16, "most distinct inputs of one fused region"),
        Option("max-row", int, 4096, "longest row a GEMM epilogue may reduce"),
        Option("singletons", bool, True, "wrap lone fusible ops in a fused region too"),
        Option("backend", str, "llvm", "the backend whose fusion policy says what its kernels "
               "hold (passes/fusion_policy.py)"),
    )
    statistics = (
        Statistic("num-groups", "fused regions created"),
        Statistic("num-fused-ops", "ops moved into fused regions"),
        Statistic("num-refused", "fusions refused (see the reasons with TILEFOLD_LOG=passes)"),
        Statistic("num-folded-reshapes", "leading-dim reshapes around a matmul folded away"),
    )

    def __init__(self, **values):
        super().__init__(**values)
        self.refusals: list[Refusal] = []

    def run_on_function(self, fn: Function) -> None:
        self.count("num-folded-reshapes", fold_row_reshapes(fn, Rewriter(fn)))
        planner = Planner(fn, self.max_ops, self.max_inputs, self.max_row,
                          fusion_policy(self.backend))
        groups = planner.plan()
        self.refusals += planner.refusals
        self.count("num-refused", len(planner.refusals))
        kept = [g for g in groups if len(g.ops) > 1 or self.singletons]
        outline(fn, kept, planner.rewriter)
        self.count("num-groups", len(kept))
        self.count("num-fused-ops", sum(len(g.ops) for g in kept))
