"""Sharding rules: for each op, an einsum-like annotation saying which placements of its
operands give which placement of its result, one mesh axis at a time; an op without a rule runs
replicated, and `explain` says so.

    matmul          "mk,kn->mn"   S(m)-,R -> S(m);  R,S(n) -> S(n);  S(k),S(k) -> P(sum)
    add (x, bias)   "ab,b->ab"    S on a letter every operand having it shards; P+P -> P
    reduce_sum      "ab->a"       S(b) -> P(sum);   reduce_max: S(b) -> P(max)
    softmax axis 1  "ab->ab"      b is fixed: sharding it has no rule (norms: their dims)
    transpose       "ab->ba"      S(0) -> S(1); P(sum) -> P(sum)
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tilefold.errors import TilefoldError
from tilefold.ir.core import Operation
from tilefold.ir.shapes import normalize_axes, normalize_axis
from tilefold.ir.types import Partial, Placement, Replicate, Shard, TensorType

LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class Einsum:
    """One op instance's annotation: a letter per dim of each operand and of the result.

    contract:  the partial a sharded letter missing from the result leaves ("sum", "max"), or
               None when such a letter may not be sharded (a mean, say).
    partial:   how partial sums pass through: "one" (multilinear: one operand P(sum), the others
               R: matmul, mul), "all" (additive: every operand P(sum): add, sub), or None.
    fixed:     letters that may not be sharded at all (the axis softmax normalizes over).
    """

    inputs: tuple[str, ...]
    output: str
    contract: str | None = None
    partial: str | None = None
    fixed: str = ""

    def __str__(self) -> str:
        return f"{','.join(self.inputs)}->{self.output}"

    def on_axis(self, placements: Sequence[Placement]) -> Placement | str:
        """The result's placement on one mesh axis from its operands' there, or why none."""
        if all(isinstance(p, Replicate) for p in placements):
            return Replicate()
        partials = [p for p in placements if isinstance(p, Partial)]
        if partials:
            kinds = {p.op for p in partials}
            others = [p for p in placements if not isinstance(p, Partial)]
            if kinds != {"sum"} or any(not isinstance(p, Replicate) for p in others):
                return "partials mixed with shards or maxes"
            if self.partial == "one" and len(partials) == 1:
                return Partial("sum")
            if self.partial == "all" and not others:
                return Partial("sum")
            return f"{self} does not pass these partial sums through"
        letters = {self.inputs[i][p.dim] for i, p in enumerate(placements)
                   if isinstance(p, Shard)}
        if len(letters) != 1:
            return f"operands are sharded on different letters of {self}"
        (letter,) = letters
        if letter in self.fixed:
            return f"dim '{letter}' of {self} cannot be split"
        for index, p in zip(self.inputs, placements, strict=True):
            if letter in index and p != Shard(index.index(letter)):
                return f"every operand with dim '{letter}' of {self} must be split on it"
        if letter in self.output:
            return Shard(self.output.index(letter))
        if self.contract is None:
            return f"dim '{letter}' of {self} is reduced, and splitting it has no rule"
        return Partial(self.contract)


Rule = Callable[[Operation], Einsum]
RULES: dict[str, Rule] = {}


def register_rule(*names: str) -> Callable[[Rule], Rule]:
    """Decorator adding a rule for ops `names`; a second rule for one op is an error."""

    def add(rule: Rule) -> Rule:
        for name in names:
            if name in RULES:
                raise TilefoldError(f"op '{name}' has a sharding rule already ({RULES[name]})")
            RULES[name] = rule
        return rule

    return add


def rule_for(op: Operation) -> Einsum | None:
    """The op's annotation: its registered rule, else the elementwise one for elementwise ops."""
    rule = RULES.get(op.name)
    if rule is not None:
        return rule(op)
    if op.has_trait("elementwise"):
        return elementwise(op)
    return None


def broadcast_letters(types: Sequence[TensorType], out_rank: int) -> tuple[str, ...]:
    """Right-aligned letters; a dim of size 1 broadcast against a larger one gets its own."""
    spare = iter(LETTERS[::-1])
    result = []
    for t in types:
        offset = out_rank - t.rank
        letters = ""
        for d, size in enumerate(t.shape):
            others = {u.shape[u.rank - t.rank + d] for u in types if u.rank - t.rank + d >= 0}
            letters += next(spare) if size == 1 and others != {1} else LETTERS[offset + d]
        result.append(letters)
    return tuple(result)


def elementwise(op: Operation) -> Einsum:
    out = op.results[0].type
    kind = {"add": "all", "sub": "all", "mul": "one", "neg": "all"}.get(op.name)
    return Einsum(broadcast_letters([v.type for v in op.operands], out.rank),
                  LETTERS[: out.rank], partial=kind)


@register_rule("matmul")
def matmul(op: Operation) -> Einsum:
    a, b = (v.type for v in op.operands)
    out = op.result.type
    batch = LETTERS[: max(out.rank - (a.rank > 1) - (b.rank > 1), 0)]

    def side(t: TensorType, transpose: bool, first: bool) -> str:
        if t.rank == 1:
            return "k"
        own = "m" if first else "n"
        pair = own + "k" if first else "k" + own
        if transpose:
            pair = pair[::-1]
        return broadcast_letters([TensorType.of(t.dtype, t.shape[:-2])], len(batch))[0] + pair

    ia = side(a, op.attr("transpose_a"), True)
    ib = side(b, op.attr("transpose_b"), False)
    output = batch + ("m" if a.rank > 1 else "") + ("n" if b.rank > 1 else "")
    return Einsum((ia, ib), output, contract="sum", partial="one")


def _reduced(op: Operation, contract: str | None) -> Einsum:
    t = op.operands[0].type
    axes = normalize_axes(op.name, op.attr("axes"), t.rank)
    letters = LETTERS[: t.rank]
    spare = iter(LETTERS[::-1])
    if op.attr("keepdims"):
        output = "".join(next(spare) if d in axes else c for d, c in enumerate(letters))
    else:
        output = "".join(c for d, c in enumerate(letters) if d not in axes)
    return Einsum((letters,), output, contract=contract)


register_rule("reduce_sum")(lambda op: _reduced(op, "sum"))
register_rule("reduce_max")(lambda op: _reduced(op, "max"))
register_rule("reduce_mean", "reduce_min")(lambda op: _reduced(op, None))


@register_rule("softmax", "log_softmax")
def along_axis(op: Operation) -> Einsum:
    t = op.operands[0].type
    letters = LETTERS[: t.rank]
    return Einsum((letters,), letters, fixed=letters[normalize_axis(op.name, op.attr("axis"),
                                                                   t.rank)])


@register_rule("layer_norm", "rms_norm")
def norm(op: Operation) -> Einsum:
    """Normalized dims [axis, rank) are fixed; weight and bias index them."""
    t = op.operands[0].type
    letters = LETTERS[: t.rank]
    axis = normalize_axis(op.name, op.attr("axis"), t.rank)
    affine = (letters[axis:],) * (len(op.operands) - 1)
    return Einsum((letters, *affine), letters, fixed=letters[axis:])


@register_rule("transpose")
def transpose(op: Operation) -> Einsum:
    letters = LETTERS[: op.operands[0].type.rank]
    return Einsum((letters,), "".join(letters[p] for p in op.attr("perm")), partial="all")


def result_placements(op: Operation, operand_placements: Sequence[Sequence[Placement]]
                      ) -> tuple[list[Placement | None], str]:
    """The result's placement on each mesh axis (None where no rule applies: the op must run
    replicated there) and a line saying how they follow."""
    einsum = rule_for(op)
    axes = list(zip(*operand_placements, strict=True))
    if einsum is None:
        return [None] * len(axes), f"'{op.name}' has no sharding rule: it runs replicated"
    placements: list[Placement | None] = []
    notes = []
    for axis, on_axis in enumerate(axes):
        got = einsum.on_axis(on_axis)
        placements.append(None if isinstance(got, str) else got)
        notes.append(f"R (axis {axis}: {got}: replicated)" if isinstance(got, str) else str(got))
    return placements, f"'{op.name}' by {einsum} gives [{','.join(notes)}]"
