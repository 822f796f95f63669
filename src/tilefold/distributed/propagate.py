"""propagate-sharding: give every ordinary op's result the placements its sharding rule derives
from its operands', redistributing operands to replicated on the mesh axes where no rule
applies; the function's result types follow.

    %h = matmul(%x, %w1) : f32[4,16]        x @m[R], w1 @m[S(1)]  ->  h @m[S(1)]
    %o = matmul(%g, %w2) : f32[4,8]         g @m[S(1)], w2 @m[S(0)] -> o @m[P(sum)]
    %y = add(%o, %b2) : f32[4,8]            P(sum) + R has no rule: o is made R first

With expand-redistribute after it, a function whose weights carry Megatron's column- and
row-parallel placements becomes the SPMD program with one all_reduce per block.
"""

from __future__ import annotations

from tilefold.distributed.rules import result_placements
from tilefold.errors import PassError, TilefoldError
from tilefold.ir import Function, Module, parse_module, print_module
from tilefold.ir.core import Operation, Value
from tilefold.ir.types import Mesh, Placement, Replicate, Sharding, format_placements
from tilefold.passes.base import Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter


def placements_of(value: Value, mesh: Mesh) -> tuple[Placement, ...]:
    """A value's placements; an unplaced one (a constant, say) is replicated everywhere."""
    s = value.type.sharding
    return s.placements if s is not None else (Replicate(),) * len(mesh.axes)


@register_pass
class PropagateSharding(Pass):
    """Derive result placements from operands' by the sharding rules; replicate the rest."""

    statistics = (
        Statistic("num-by-rule", "ops placed by a sharding rule"),
        Statistic("num-replicated", "ops run replicated (no rule applied)"),
        Statistic("num-redistributes", "redistribute ops inserted"),
    )

    explanations: list[str]

    def run_on_function(self, fn: Function) -> None:
        self.explanations = []
        meshes = {v.type.sharding.mesh for v in fn.args if v.type.sharding is not None}
        if len(meshes) != 1:
            return  # nothing placed (or several meshes: not this pass's job)
        (mesh,) = meshes
        rewriter = Rewriter(fn)
        for op in list(fn.body.ops):
            if op.has_trait("terminator"):
                fn.result_types = [v.type for v in op.operands]
            elif not op.has_trait("sharding") and not op.regions:
                self.place(op, mesh, rewriter)

    def place(self, op: Operation, mesh: Mesh, rewriter: Rewriter) -> None:
        if not any(v.type.sharding is not None for v in op.operands):
            return
        operands = [placements_of(v, mesh) for v in op.operands]
        placements, why = result_placements(op, operands)
        if None in placements:  # replicate the operands on the axes without a rule
            op.operands = [
                self.to(v, tuple(Replicate() if p is None else q
                                 for p, q in zip(placements, ps, strict=True)), op, rewriter)
                for v, ps in zip(op.operands, operands, strict=True)
            ]
            placements = [Replicate() if p is None else p for p in placements]
            self.count("num-replicated")
        else:
            self.count("num-by-rule")
        self.explanations.append(f"%{op.results[0].name}: {why}")
        for result in op.results:
            result.type = result.type.with_sharding(Sharding(mesh, tuple(placements)))

    def to(self, value: Value, placements: tuple[Placement, ...], before: Operation,
           rewriter: Rewriter) -> Value:
        """`value` redistributed to `placements` (itself if it has them)."""
        if value.type.sharding is None or value.type.sharding.placements == placements:
            return value
        try:
            op = rewriter.create(before, "redistribute", [value],
                                 {"placements": format_placements(placements)})
        except TilefoldError as exc:
            raise PassError(f"propagate-sharding: %{value.name}: {exc.message}") from None
        self.count("num-redistributes")
        return op.result


def explain(module: Module, function: str = "main") -> list[str]:
    """One line per placed op of a function: the rule that placed it, or that none did and it
    runs replicated. The module itself is left as it is."""
    copy = parse_module(print_module(module))
    sharded = PropagateSharding()
    sharded.run_on_function(copy[function])
    return sharded.explanations
