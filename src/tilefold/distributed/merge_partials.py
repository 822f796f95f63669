"""merge-partials: reduce partial sums once, after the linear ops that combine them, instead of
once per operand; on the global placed program (after expand-redistribute).

    add(all_reduce(a), all_reduce(b))   ->  all_reduce(add(a, b))    one collective, not two
    sub(all_reduce(a), all_reduce(b))   ->  all_reduce(sub(a, b))
    neg(all_reduce(a))                  ->  all_reduce(neg(a))       sunk: it may merge later
    mul(all_reduce(a), r)               ->  all_reduce(mul(a, r))    r replicated on the axis

The same holds for reduce_scatter when every operand is one (same axis and dim). Only sums
move, and only through ops linear in the partial operand: sum_k(a_k) + sum_k(b_k) =
sum_k(a_k + b_k), but max_k(a_k) + max_k(b_k) is not max_k(a_k + b_k), nor exp(sum) a sum of
exps. A collective moves only when the op is its result's one use and the op's result has the
operand's shape (a broadcast would make the reduced tensor larger).

Why the global program: there the placements say what each value is (`P(sum)` on an axis is
exactly "reduce me before use"), so the sharding rules decide whether the combined op is legal
(`result_placements`), and the simulator checks the result; on the per-rank program the same
facts would have to be rebuilt from the spmd.* attributes.
"""

from __future__ import annotations

from collections import Counter

from tilefold.distributed.local import placements_in
from tilefold.distributed.rules import result_placements
from tilefold.errors import PassError, TilefoldError
from tilefold.ir import Function
from tilefold.ir.core import Operation
from tilefold.ir.types import Partial, Sharding
from tilefold.passes.base import Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter

# op -> how many of its operands are reduced results it may combine
LINEAR = {
    "add": "all",  # sum(a) + sum(b) = sum(a + b)
    "sub": "all",  # sum(a) - sum(b) = sum(a - b)
    "neg": "all",  # -sum(a) = sum(-a)
    "mul": "one",  # sum(a) * r = sum(a * r), r the same on every device of the axis
}
MOVABLE = frozenset({"all_reduce", "reduce_scatter"})  # collectives of a partial sum


def reduces_sum(op: Operation | None) -> bool:
    """Whether `op` is a collective reducing a partial sum on its axis."""
    if op is None or op.name not in MOVABLE:
        return False
    t = op.operands[0].type
    return t.sharding.placements[t.sharding.mesh.axis_index(op.attr("axis"))] == Partial("sum")


@register_pass
class MergePartials(Pass):
    """Reduce partial sums once after add/sub/neg/mul-by-replicated, not once per operand."""

    statistics = (
        Statistic("num-merged", "collectives removed by reducing a combination once"),
        Statistic("num-sunk", "collectives moved past a linear op"),
    )

    def run_on_function(self, fn: Function) -> None:
        rewriter = Rewriter(fn)
        changed = True
        while changed:
            uses = Counter(v for op in fn.ops for v in op.operands)
            changed = any(self.rewrite(op, uses, rewriter) for op in list(fn.body.ops)
                          if op.name in LINEAR)

    def rewrite(self, op: Operation, uses: Counter, rewriter: Rewriter) -> bool:
        """Move the collectives feeding `op` after it, if that is exact; whether it did."""
        if op.result.type.sharding is None:
            return False  # an unplaced result: nothing says what the combination is
        kind = LINEAR[op.name]
        here = Counter(op.operands)
        reduced = [v for v in here if reduces_sum(v.defining_op) and uses[v] == here[v]
                   and v.type.shape == op.result.type.shape]
        if not reduced:
            return False
        first = reduced[0].defining_op
        if any((v.defining_op.name, v.defining_op.attrs) != (first.name, first.attrs)
               for v in reduced):
            return False
        if len(reduced) != (len(here) if kind == "all" else 1):
            return False
        if first.name == "reduce_scatter" and len(reduced) != len(op.operands):
            return False  # the other operand is split on the axis: the sum is not there
        operands = [v.defining_op.operands[0] if v in reduced else v for v in op.operands]
        mesh = op.result.type.sharding.mesh
        placements, _ = result_placements(op, [placements_in(v.type, mesh) for v in operands])
        axis = mesh.axis_index(first.attr("axis"))
        if None in placements or placements[axis] != Partial("sum"):
            return False
        try:
            inner = rewriter.create(op, op.name, operands, op.attrs, loc=op.loc)
            inner.result.type = inner.result.type.with_sharding(
                Sharding(mesh, tuple(placements)))
            outer = rewriter.create(op, first.name, [inner.result], first.attrs, loc=first.loc)
        except TilefoldError as exc:  # the rules said it fits: a bug if not
            raise PassError(f"merge-partials: %{op.result.name}: {exc.message}") from None
        if outer.result.type != op.result.type:
            outer.erase()
            inner.erase()
            return False
        name = op.result.name
        rewriter.replace(op, [outer.result])
        outer.result.name = name
        for v in reduced:
            v.defining_op.erase()
        self.count("num-merged", len(reduced) - 1)
        self.count("num-sunk", len(reduced) == 1)
        return True
