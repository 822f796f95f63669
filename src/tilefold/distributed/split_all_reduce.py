"""split-all-reduce: an all_reduce whose result feeds a chain of elementwise ops and row-wise
norms becomes reduce_scatter -> the chain on 1/n of the rows -> all_gather (Megatron's sequence
parallelism), where the cost model says it pays; on the global placed program.

    %s = all_reduce(%p) {axis = "tp"} : [T,H] @m[R]         %s = reduce_scatter(%p) {dim = 0}
    %a = add(%s, %b) : [T,H] @m[R]                    ->    %a = add(%s, %b) : @m[S(0)]
    %n = layer_norm(%a, %g, %e) : [T,H] @m[R]               %n = layer_norm(%a, ..) : @m[S(0)]
                                                            %y = all_gather(%n) : @m[R]

On a ring, reduce_scatter + all_gather move the bytes of one all_reduce in as many steps, so
what is won is the chain's compute on a block instead of the whole tensor; a cost model whose
all_reduce is cheaper than the pair (a tree for small messages, say) keeps the all_reduce.
The chain is a run of ops each the one use of the value before it, each elementwise or
normalizing (softmax, a norm: rows normalized on their own), none changing the shape; it is
split on the first dim that every op's sharding rule lets it split (never a normalized dim)
and that the axis divides; a replicated operand that has that dim is cut with local_slice,
which moves nothing. On the global program the rules check every
new placement and the simulator runs the result, as with merge-partials.
"""

from __future__ import annotations

from collections import defaultdict

from tilefold.distributed.cost import DEVICES, AlphaBeta, CostModel, Estimate, link
from tilefold.distributed.local import placements_in
from tilefold.distributed.rules import result_placements
from tilefold.errors import PassError, TilefoldError
from tilefold.ir import Function
from tilefold.ir.core import Operation, Value
from tilefold.ir.types import Mesh, Replicate, Shard, Sharding
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter


def chain_after(value: Value, users: dict[Value, list[Operation]]) -> list[Operation]:
    """The ops that can run on a block of `value`: each the one use of the one before."""
    chain: list[Operation] = []
    while len(users[value]) == 1:
        op = users[value][0]
        row_wise = op.has_trait("elementwise") or op.has_trait("normalizing")
        if not row_wise or len(op.results) != 1:
            break
        if op.result.type.shape != value.type.shape or op.result.type.sharding is None:
            break
        chain.append(op)
        value = op.result
    return chain


@register_pass
class SplitAllReduce(Pass):
    """all_reduce -> elementwise/norm chain as reduce_scatter, chain on a block, all_gather."""

    options = (
        Option("device", str, "h100", "the device the cost model prices compute on"),
        Option("link", str, "", "the link class of every axis (default: nvlink in a node)"),
    )
    statistics = (
        Statistic("num-split", "all_reduces split into reduce_scatter + all_gather"),
        Statistic("num-kept", "all_reduces kept because the split did not pay"),
        Statistic("num-sharded-ops", "ops that now run on a block"),
    )

    def cost_model(self, mesh: Mesh) -> CostModel:
        """What decides whether a split pays (a subclass may price differently)."""
        if self.device not in DEVICES:
            raise PassError(f"split-all-reduce{{device={self.device}}}: no such device; known: "
                            f"{', '.join(DEVICES)}")
        links = {name: link(self.link) for name in mesh.names} if self.link else {}
        return AlphaBeta(mesh, DEVICES[self.device], links)

    def run_on_function(self, fn: Function) -> None:
        rewriter = Rewriter(fn)
        costs: dict[Mesh, CostModel] = {}
        for op in [op for op in fn.ops if op.name == "all_reduce"]:
            users: dict[Value, list[Operation]] = defaultdict(list)
            for user in fn.ops:
                for v in dict.fromkeys(user.operands):
                    users[v].append(user)
            chain = chain_after(op.result, users)
            if not chain or op.operands[0].type.sharding is None:
                continue
            mesh = op.result.type.sharding.mesh
            cost = costs.setdefault(mesh, self.cost_model(mesh))
            self.split(op, chain, cost, rewriter)

    def split(self, ar: Operation, chain: list[Operation], cost: CostModel,
              rewriter: Rewriter) -> None:
        """Split `ar` and run `chain` on blocks, on the first dim that works, if it pays."""
        for dim in range(ar.result.type.rank):
            made = self.attempt(ar, chain, dim, rewriter)
            if made is None:
                continue
            new, pairs = made
            old = [o for o, _ in pairs]
            if total(cost, new).seconds >= total(cost, old).seconds:
                undo(new)
                self.count("num-kept")
                return
            rewriter.fn.replace_all_uses(old[-1].result, new[-1].result)
            undo(old)
            # the new ops take the old names; the last old value is now the all_gather's
            for o, n in pairs[:-1]:
                n.result.name = o.result.name
            new[-1].result.name = old[-1].result.name
            self.count("num-split")
            self.count("num-sharded-ops", len(pairs) - 1)
            return

    def attempt(self, ar: Operation, chain: list[Operation], dim: int, rewriter: Rewriter
                ) -> tuple[list[Operation], list[tuple[Operation, Operation]]] | None:
        """The new ops (reduce_scatter, the chain on blocks with their local_slices, the
        all_gather) and each old op with its new form, or None if `dim` cannot be split."""
        axis_name = ar.attr("axis")
        mesh = ar.result.type.sharding.mesh
        axis = mesh.axis_index(axis_name)
        made: list[Operation] = []
        try:
            made.append(rewriter.create(ar, "reduce_scatter", ar.operands,
                                        {"axis": axis_name, "dim": dim}, loc=ar.loc))
        except TilefoldError:
            return None  # uneven, or a later axis splits the dim
        pairs = [(ar, made[0])]
        for op in chain:
            got = self.on_block(op, pairs[-1][0].result, pairs[-1][1].result, dim, axis,
                                rewriter)
            if got is None:
                break
            made.extend(got)
            pairs.append((op, got[-1]))
        last = pairs[-1][0]
        if len(pairs) > 1:
            made.append(rewriter.create(last, "all_gather", [pairs[-1][1].result],
                                        {"axis": axis_name}, loc=ar.loc))
            if made[-1].result.type == last.result.type:
                return made, pairs
        return undo(made)

    def on_block(self, op: Operation, old: Value, block: Value, dim: int, axis: int,
                 rewriter: Rewriter) -> list[Operation] | None:
        """`op` made to take `block` in place of `old` (block: split on `dim` over `axis`),
        with any replicated operand that has the dim cut to match; None if its rule refuses."""
        mesh = block.type.sharding.mesh
        rank = op.result.type.rank
        made: list[Operation] = []
        operands = []
        for v in op.operands:
            if v is old:
                operands.append(block)
                continue
            own = dim - (rank - v.type.rank)
            if own < 0 or v.type.shape[own] == 1:
                operands.append(v)
                continue
            if placements_in(v.type, mesh)[axis] != Replicate():
                return undo(made)
            try:
                made.append(rewriter.create(op, "local_slice", [v],
                                            {"axis": mesh.names[axis], "dim": own}))
            except TilefoldError:
                return undo(made)
            operands.append(made[-1].result)
        placements, _ = result_placements(op, [placements_in(v.type, mesh) for v in operands])
        want = list(op.result.type.sharding.placements)
        want[axis] = Shard(dim)
        if placements != want:
            return undo(made)
        made.append(rewriter.create(op, op.name, operands, op.attrs, loc=op.loc))
        made[-1].result.type = made[-1].result.type.with_sharding(Sharding(mesh, tuple(want)))
        return made


def undo(made: list[Operation]) -> None:
    for o in reversed(made):
        o.erase()


def total(cost: CostModel, ops: list[Operation]) -> Estimate:
    out = Estimate()
    for o in ops:
        out += cost.op(o)
    return out
