"""Sharding rules: for each op, an einsum-like annotation saying which placements of its
operands give which placement of its result, one mesh axis at a time; an op without a rule runs
replicated, and `explain` says so.

    matmul          "mk,kn->mn"   S(m)-,R -> S(m);  R,S(n) -> S(n);  S(k),S(k) -> P(sum)
    add (x, bias)   "ab,b->ab"    S on a letter every operand having it shards; P+P -> P
    reduce_sum      "ab->a"       S(b) -> P(sum);   reduce_max: S(b) -> P(max)
    softmax axis 1  "ab->ab"      b is fixed: sharding it has no rule (norms: their dims)
    transpose       "ab->ba"      S(0) -> S(1); P(sum) -> P(sum)

A padded shard S(d,pad) passes through like S(d) and leaves a padded result; a reduced
letter's padding is masked before the op runs (`padding.py`), so it gives P(sum) or P(max).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tilefold.errors import TilefoldError
from tilefold.ir.core import Operation
from tilefold.ir.shapes import normalize_axes, normalize_axis
from tilefold.ir.types import (
    Partial,
    Placement,
    Replicate,
    Shard,
    Sharding,
    TensorType,
    level_shape,
    sharding_problem,
)

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
            if letter in index and not (isinstance(p, Shard) and p.dim == index.index(letter)):
                return f"every operand with dim '{letter}' of {self} must be split on it"
        if letter in self.output:  # padding rows pass through to the result's padding
            pad = any(isinstance(p, Shard) and p.pad for p in placements)
            return Shard(self.output.index(letter), pad)
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
    """The op's annotation: its registered rule, else the elementwise one for elementwise ops
    and the normalizing one for normalizing ops."""
    rule = RULES.get(op.name)
    if rule is not None:
        return rule(op)
    if op.has_trait("elementwise"):
        return elementwise(op)
    if op.has_trait("normalizing"):
        return normalizing(op)
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


def normalizing(op: Operation) -> Einsum:
    """A normalizing op (softmax, a norm): its normalized dims are fixed; weight and bias index
    them."""
    letters = LETTERS[: op.operands[0].type.rank]
    fixed = "".join(letters[a] for a in op.reduced_axes())
    return Einsum((letters, *(fixed,) * (len(op.operands) - 1)), letters, fixed=fixed)


@register_rule("transpose")
def transpose(op: Operation) -> Einsum:
    letters = LETTERS[: op.operands[0].type.rank]
    return Einsum((letters,), "".join(letters[p] for p in op.attr("perm")), partial="all")


@register_rule("reshape")
def reshape(op: Operation) -> Einsum:
    """Dims are grouped where the running element counts of input and output agree; in each
    group the leading non-unit input dim shares a letter with the leading non-unit output dim
    (cutting one in contiguous blocks cuts the other alike), the rest of the group is fixed."""
    src, dst = op.operands[0].type.shape, op.result.type.shape
    spare = iter(LETTERS[::-1])
    inputs, output, fixed = [""] * len(src), [""] * len(dst), ""
    i = o = 0
    while i < len(src) or o < len(dst):
        gi, go = [i], [o]
        ni = src[i] if i < len(src) else 1
        no = dst[o] if o < len(dst) else 1
        while ni != no and isinstance(ni, int) and isinstance(no, int):
            if ni < no and i + len(gi) < len(src):
                gi.append(i + len(gi))
                ni *= src[gi[-1]]
            elif o + len(go) < len(dst):
                go.append(o + len(go))
                no *= dst[go[-1]]
            else:
                break
        step_i, step_o = len(gi), len(go)
        gi, go = [d for d in gi if d < len(src)], [d for d in go if d < len(dst)]
        lead_i = next((d for d in gi if src[d] != 1), None)
        lead_o = next((d for d in go if dst[d] != 1), None)
        shared = next(spare)
        if ni != no or lead_i is None or lead_o is None:
            fixed += shared
        for d in gi:
            inputs[d] = shared if d == lead_i else next(spare)
        for d in go:
            output[d] = shared if d == lead_o else next(spare)
        fixed += "".join(inputs[d] for d in gi if d != lead_i)
        i, o = i + step_i, o + step_o
    return Einsum(("".join(inputs),), "".join(output), partial="all", fixed=fixed)


@register_rule("expand_dims", "squeeze")
def unit_dims(op: Operation) -> Einsum:
    """Kept dims keep their letters; inserted or dropped unit dims get their own."""
    src, dst = op.operands[0].type, op.result.type
    letters = LETTERS[: max(src.rank, dst.rank)]
    axes = set(normalize_axes(op.name, op.attr("axes"), max(src.rank, dst.rank)))
    kept = "".join(c for d, c in enumerate(letters) if d not in axes)
    inserted = op.name == "expand_dims"
    return Einsum((kept if inserted else letters,), letters if inserted else kept, partial="all")


@register_rule("slice")
def slice_rule(op: Operation) -> Einsum:
    """A dim kept whole in order may be split; a dim the slice cuts is fixed."""
    t = op.operands[0].type
    letters = LETTERS[: t.rank]
    fixed = ""
    for c, d, a, b, s in zip(letters, t.shape, op.attr("starts"), op.attr("stops"),
                             op.attr("steps"), strict=True):
        if not isinstance(d, int) or range(*slice(a, b, s).indices(d)) != range(d):
            fixed += c
    return Einsum((letters,), letters, partial="all", fixed=fixed)


@register_rule("gather")
def gather(op: Operation) -> Einsum:
    """Table dims besides `axis` pass to the result; splitting the looked-up dim (a
    vocab-parallel embedding) leaves each device the rows it holds and zeros: P(sum)."""
    x, ids = (v.type for v in op.operands)
    axis = normalize_axis("gather", op.attr("axis"), x.rank)
    table = LETTERS[: x.rank]
    index = LETTERS[x.rank : x.rank + ids.rank]
    return Einsum((table, index), table[:axis] + index + table[axis + 1 :], contract="sum",
                  partial="one")


@register_rule("scaled_dot_product_attention")
def attention(op: Operation) -> Einsum:
    """q [.., L, E], k [.., S, E], v [.., S, F] -> [.., L, F]: batch and head dims split (with
    GQA too: a block of query heads uses the same block of key/value heads), as does F; S and
    E may not (softmax over S is not linear); L may unless the mask is causal, which counts
    query rows from the first."""
    q, k, _, *mask = (t.type for t in op.operands)
    lead = broadcast_letters([TensorType.of(q.dtype, q.shape[:-2]),
                              TensorType.of(k.dtype, k.shape[:-2])], q.rank - 2)
    queries, keys = lead[0] + "ln", lead[1] + "mn"
    fixed = "mn" + ("l" if op.attr("is_causal") else "")
    letters = [queries, keys, lead[1] + "mo"]
    if mask:
        scores = lead[0] + "lm"
        (m,) = mask
        spare = iter("pqrstu")  # a size-1 dim broadcast over the scores: not split
        full = (*op.result.type.shape[:-1], k.shape[-2])
        own = ""
        for d, size in enumerate(m.shape):
            out_d = len(full) - m.rank + d
            own += next(spare) if size == 1 and full[out_d] != 1 else scores[out_d]
        letters.append(own)
        fixed += "".join(c for c in own if c not in scores)
    return Einsum(tuple(letters), lead[0] + "lo", fixed=fixed)


def uneven_axes(op: Operation, placements: Sequence[Placement | None]) -> dict[int, str]:
    """The mesh axes whose derived shard does not split the result evenly (unpadded), or pads a
    dim whose blocks differ from its operands' (a reshape merging a padded dim), with the
    reason."""
    meshes = [v.type.sharding.mesh for v in op.operands if v.type.sharding is not None]
    if not meshes:
        return {}
    done: list[Placement] = [Replicate()] * len(placements)
    bad = {}
    for axis, p in enumerate(placements):
        if isinstance(p, Shard):
            done[axis] = p
            result = op.results[0].type.with_sharding(Sharding(meshes[0], tuple(done)))
            problem = sharding_problem(result) or (padded_mismatch(op, result, axis)
                                                   if p.pad else None)
            if problem is not None:
                bad[axis] = problem
                done[axis] = Replicate()
    return bad


def padded_mismatch(op: Operation, result: TensorType, axis: int) -> str | None:
    """Why a padded shard on `axis` cannot pass from the operands to `result`: each operand dim
    split there must be as long as the result's, so that its padding rows are the result's."""
    want = level_shape(result, axis)[result.sharding.placements[axis].dim]
    for v in op.operands:
        p = v.type.sharding.placements[axis] if v.type.sharding is not None else None
        if isinstance(p, Shard) and level_shape(v.type, axis)[p.dim] != want:
            return (f"padded {p} of %{v.name}: {v.type} cannot become dim "
                    f"{result.sharding.placements[axis].dim} ({want}) of {result}")
    return None


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
    got = [einsum.on_axis(on_axis) for on_axis in axes]
    derived = [None if isinstance(g, str) else g for g in got]
    for axis, problem in uneven_axes(op, derived).items():
        got[axis] = f"{got[axis]} is uneven ({problem})"
    for axis, g in enumerate(got):
        placements.append(None if isinstance(g, str) else g)
        notes.append(f"R (axis {axis}: {g}: replicated)" if isinstance(g, str) else str(g))
    return placements, f"'{op.name}' by {einsum} gives [{','.join(notes)}]"
