"""A sharding plan as text: the mesh, then one line per function argument and per chosen
intermediate, `%name: @m[S(0),R]`; printed, diffed, edited, parsed back, and applied to an
unplaced module (placements on the arguments, propagate-sharding, the chosen intermediates
redistributed where they are defined, expand-redistribute).

    # strategy: megatron
    mesh @m [dp=2, tp=4]
    %x: @m[S(0),R]
    %l0_fc1_w: @m[R,S(1)]
    %l0_n1: @m[S(0),R]          # an intermediate: redistributed after its op
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tilefold.distributed import merge_partials  # noqa: F401 - registers merge-partials
from tilefold.distributed.propagate import PropagateSharding
from tilefold.errors import TilefoldError
from tilefold.ir import Function, Module, parse_module, print_module, verify
from tilefold.ir.core import Operation
from tilefold.ir.types import (
    Mesh,
    Placement,
    Replicate,
    Sharding,
    format_placements,
    parse_placements,
    sharding_problem,
)
from tilefold.passes import run_pipeline
from tilefold.passes.rewrite import Rewriter

Placements = tuple[Placement, ...]
LINE = re.compile(r"%([\w.]+)\s*:\s*@(\w+)\s*(\[.*\])")
MESH = re.compile(r"mesh\s+@(\w+)\s*\[(.*)\]")


class PlanError(TilefoldError):
    """A plan that does not parse, or does not fit the module it is applied to."""


def parse_mesh(text: str) -> Mesh:
    """`mesh @m [dp=2, tp=4]`, or just `dp=2,tp=4` (a mesh named m), as a Mesh."""
    m = MESH.fullmatch(text.strip())
    name, body = (m.group(1), m.group(2)) if m else ("m", text)
    axes = []
    for part in filter(None, (p.strip() for p in body.split(","))):
        axis, eq, size = part.partition("=")
        if not eq or not size.strip().isdigit():
            raise PlanError(f"mesh {text!r}: write axes as name=size, e.g. dp=2,tp=4")
        axes.append((axis.strip(), int(size)))
    if not axes:
        raise PlanError(f"mesh {text!r} has no axes; e.g. tp=8 or dp=2,tp=4")
    return Mesh(name, tuple(axes))


@dataclass(frozen=True)
class Plan:
    """Placements for named values of one function on one mesh, in order."""

    mesh: Mesh
    entries: tuple[tuple[str, Placements], ...]
    strategy: str = ""
    function: str = "main"

    def __post_init__(self) -> None:
        names = [n for n, _ in self.entries]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise PlanError(f"plan places {', '.join('%' + n for n in twice)} twice")
        for name, ps in self.entries:
            if len(ps) != len(self.mesh.axes):
                raise PlanError(f"plan: %{name} has {len(ps)} placements for the "
                                f"{len(self.mesh.axes)} axes of {self.mesh.declaration()}")

    def __getitem__(self, name: str) -> Placements:
        return dict(self.entries)[name]

    @property
    def text(self) -> str:
        head = [f"# strategy: {self.strategy}"] if self.strategy else []
        head += [f"# function: @{self.function}"] if self.function != "main" else []
        lines = [f"%{n}: @{self.mesh.name}{format_placements(ps)}" for n, ps in self.entries]
        return "\n".join([*head, self.mesh.declaration(), *lines]) + "\n"

    def __str__(self) -> str:
        return self.text

    @staticmethod
    def parse(text: str) -> Plan:
        strategy, function, mesh, entries = "", "main", None, []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line.startswith("#"):
                line = line.split("#", 1)[0].strip()  # a comment after an entry
            if line.startswith("# strategy:"):
                strategy = line.split(":", 1)[1].strip()
            elif line.startswith("# function:"):
                function = line.split(":", 1)[1].strip().lstrip("@")
            elif not line or line.startswith("#"):
                continue
            elif line.startswith("mesh"):
                mesh = parse_mesh(line)
            else:
                m = LINE.fullmatch(line)
                if m is None or mesh is None or m.group(2) != mesh.name:
                    raise PlanError(
                        f"plan line {number}: {raw!r}: expected '%name: @"
                        f"{mesh.name if mesh else 'm'}[...]' after the mesh line")
                try:
                    entries.append((m.group(1), parse_placements(m.group(3))))
                except TilefoldError as exc:
                    raise PlanError(f"plan line {number}: {exc.message}") from None
        if mesh is None:
            raise PlanError("plan has no mesh line (e.g. mesh @m [tp=8])")
        return Plan(mesh, tuple(entries), strategy, function)

    def place(self, module: Module) -> Module:
        """A copy of `module` with the mesh declared and the arguments placed (arguments the
        plan leaves out are replicated); intermediates are not touched."""
        copy = parse_module(print_module(module))
        fn = function(copy, self.function)
        if self.mesh.name in copy.meshes and copy.meshes[self.mesh.name] != self.mesh:
            raise PlanError(f"the module declares {copy.meshes[self.mesh.name].declaration()}"
                            f", the plan {self.mesh.declaration()}")
        copy.meshes[self.mesh.name] = self.mesh
        known = {v.name for v in fn.values()}
        missing = [n for n, _ in self.entries if n not in known]
        if missing:
            raise PlanError(f"plan places {', '.join('%' + n for n in missing)}, which "
                            f"@{fn.name} does not have")
        chosen = dict(self.entries)
        for arg in fn.args:
            ps = chosen.get(arg.name, (Replicate(),) * len(self.mesh.axes))
            arg.type = arg.type.with_sharding(Sharding(self.mesh, ps))
            problem = sharding_problem(arg.type)
            if problem is not None:
                raise PlanError(f"plan: %{arg.name}: {arg.type}: {problem}")
        return copy

    def apply(self, module: Module) -> Module:
        """The partitioned module: placed, propagated, intermediates redistributed, every
        redistribute expanded into collectives, and partial sums combined before they are
        reduced (merge-partials); verified."""
        placed = self.place(module)
        fn = function(placed, self.function)
        args = {a.name for a in fn.args}
        Planned({n: ps for n, ps in self.entries if n not in args}).run_on_function(fn)
        run_pipeline(placed, "expand-redistribute,merge-partials")
        return verify(placed)


class Planned(PropagateSharding):
    """propagate-sharding that redistributes the results a plan names right after their op."""

    def __init__(self, chosen: dict[str, Placements]):
        super().__init__()
        self.chosen = chosen

    def place(self, op: Operation, mesh: Mesh, rewriter: Rewriter) -> None:
        super().place(op, mesh, rewriter)
        block = op.parent
        for result in op.results:
            want = self.chosen.get(result.name)
            if want is None or result.type.sharding is None:
                continue
            if result.type.sharding.placements == want:
                continue
            value = self.to(result, want, block.ops[block.ops.index(op) + 1], rewriter)
            rewriter.fn.replace_all_uses(result, value)
            value.defining_op.operands = [result]


def function(module: Module, name: str) -> Function:
    if name not in module.functions:
        known = ", ".join(f"@{n}" for n in module.functions) or "none"
        raise PlanError(f"plan is for @{name}, but the module has: {known}")
    return module.functions[name]
