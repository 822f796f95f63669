"""canonicalize: algebraic identities and layout-op folding, applied to a fixpoint.

The rules are one table, one rule a line, each with its identity. A rule looks at one op (the
`Site`) and returns the value that replaces its result, or None. A replacement is taken only if
its type equals the result's type exactly, so `x + 0 -> x` never drops a broadcast. Ops left
unused by a rewrite are erased (as MLIR's greedy rewriter does).

Float rules are exact except for the sign of zero: `x + 0.0 -> x` turns `-0.0 + 0.0 = +0.0` into
`-0.0`, as XLA and TVM allow; the option `strict-signed-zeros` keeps only the rules that are
exact bit for bit (LLVM's default). `x * 0 -> 0` is for integers only (NaN * 0 and inf * 0 are
NaN).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import TilefoldError
from tilefold.ir import OPS, Function, Operation, Value
from tilefold.ir.types import TensorType
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.casts import holds, same_family
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter, constant_of, splat_of

log = logging.getLogger("tilefold.passes")


class Site:
    """The op a rule looks at (`s[i]` is its operand i), with the matchers and builders."""

    def __init__(self, op: Operation, rewriter: Rewriter, strict_signed_zeros: bool):
        self.op = op
        self.rewriter = rewriter
        self.strict = strict_signed_zeros

    def __getitem__(self, index: int) -> Value:
        return self.op.operands[index]

    @property
    def type(self) -> TensorType:
        return self.op.results[0].type

    @property
    def integral(self) -> bool:
        """The result holds integers or bools, where arithmetic has no NaN, inf or -0."""
        return not self.type.dtype.is_float

    def attr(self, key: str) -> Any:
        return self.op.attr(key)

    @staticmethod
    def keep(value: Value, condition: bool) -> Value | None:
        return value if condition else None

    @staticmethod
    def defined_by(value: Value, name: str) -> Operation | None:
        """The op defining `value` when it is a `name` op."""
        op = value.defining_op
        return op if op is not None and op.name == name else None

    def unwrap(self, name: str) -> Value | None:
        """`x` when operand 0 is `name(x)`."""
        inner = self.defined_by(self[0], name)
        return inner.operands[0] if inner is not None else None

    @staticmethod
    def splat(value: Value, element: float) -> bool:
        """`value` is a constant whose elements all equal `element` (any sign of zero)."""
        found = splat_of(value)
        return found is not None and found == element

    def zero(self, value: Value, exact_sign: float = 0.0) -> bool:
        """`value` is all zeros; with strict signed zeros, float zeros of `exact_sign` only."""
        found = splat_of(value)
        if found is None or found != 0:
            return False
        if not self.strict or not dtypes.dtype(found.dtype).is_float:
            return True
        return bool(np.signbit(np.float64(found))) == bool(np.signbit(exact_sign))

    def zeros_if(self, condition: bool) -> Value | None:
        """A zero tensor of the result's type (a scalar broadcast to its shape) if `condition`."""
        if not condition:
            return None
        scalar = self.new("constant", value=np.zeros((), self.type.dtype.np_dtype))
        if not self.type.shape:
            return scalar
        return self.new("broadcast_to", scalar, shape=self.type.shape)

    def new(self, name: str, *operands: Value | None, **attrs: Any) -> Value | None:
        """A new op before the site, with the site's location; None if an operand is None."""
        if any(v is None for v in operands):
            return None
        op = self.rewriter.create(self.op, name, operands, attrs, loc=self.op.loc)
        return op.results[0]


Rewrite = Callable[[Site], Value | None]


@dataclass(frozen=True)
class Rule:
    """A rewrite of the ops named `ops`; `identity` is its algebra, for readers and logs."""

    ops: tuple[str, ...] | str
    identity: str
    rewrite: Rewrite

    @property
    def names(self) -> tuple[str, ...]:
        return (self.ops,) if isinstance(self.ops, str) else self.ops


def _swap_constant(s: Site) -> Value | None:
    swap = constant_of(s[0]) is not None and constant_of(s[1]) is None
    return s.new(s.op.name, s[1], s[0]) if swap else None


def _compose_transposes(s: Site) -> Value | None:
    inner = s.defined_by(s[0], "transpose")
    if inner is None:
        return None
    p, q = inner.attr("perm"), s.attr("perm")
    return s.new("transpose", inner.operands[0], perm=tuple(p[i] for i in q))


def _cast_chain(s: Site) -> Value | None:
    inner = s.defined_by(s[0], "cast")
    if inner is None:
        return None
    x = inner.operands[0]
    a, b, c = x.type.dtype, s[0].type.dtype, s.type.dtype
    if not holds(a, b):
        return None
    if c == a:
        return x
    return s.new("cast", x, dtype=c) if same_family(a, b) else None


def _undo(inner: str) -> Rewrite:
    """An op that undoes `inner` on the same axes (squeeze of expand_dims and back) -> x."""

    def rewrite(s: Site) -> Value | None:
        op = s.defined_by(s[0], inner)
        same = op is not None and sorted(op.attr("axes")) == sorted(s.attr("axes"))
        return op.operands[0] if same else None

    return rewrite


def _reshape_chain(s: Site) -> Value | None:
    return s.new("reshape", s.unwrap("reshape"), shape=s.attr("shape"))


def _batch_reshape_first(s: Site) -> Value | None:
    """reshape(transpose(x, p)) -> transpose(reshape(transpose(x, q)), swap) when the transpose
    brings x's last dim second to last (p = q then a swap of the last two dims) and the reshape
    changes only the dims before the last two (attention's heads joined into one batch dim for
    a matmul, key transposed): the swap then meets the matmul, which reads its operand
    transposed as it packs it, and the reshape, of a layout whose last dim is x's own, is a
    view or a copy of whole rows (reshaped last, the transposed operand had been copied
    element by element)."""
    inner = s.defined_by(s[0], "transpose")
    if inner is None:
        return None
    x, perm, out = inner.operands[0], tuple(inner.attr("perm")), tuple(s.type.shape)
    rank = len(perm)
    if rank < 3 or perm[-2] != rank - 1 or len(out) < 2 or \
            out[-2:] != tuple(s[0].type.shape[-2:]) or \
            not all(isinstance(d, int) for d in (*out, *x.type.shape)):
        return None
    keep = (*perm[:-2], perm[-1], perm[-2])
    kept = x if keep == tuple(range(rank)) else s.new("transpose", x, perm=keep)
    joined = s.new("reshape", kept, shape=(*out[:-2], out[-1], out[-2]))
    return s.new("transpose", joined, perm=(*range(len(out) - 2), len(out) - 1, len(out) - 2))


def _zeros(value: Value) -> bool:
    """`value` is all zeros: a zero constant, or one broadcast."""
    op = value.defining_op
    if op is not None and op.name == "broadcast_to":
        value = op.operands[0]
    found = splat_of(value)
    return found is not None and found == 0


def _accumulate_into(s: Site) -> Value | None:
    """index_put(zeros, v, idx, accumulate) + y -> index_put(y, v, idx, accumulate): the rows
    are added into y itself, not into a zero tensor of y's size then added to y (a tied
    embedding's gradient, the LM head's plus the lookup's: GPT-2's 147 MB held twice). The
    sum is reassociated: y first, then each row, rounding as a sum in that order does."""
    for a, b in ((0, 1), (1, 0)):
        put = s.defined_by(s[a], "index_put")
        if put is not None and put.attr("accumulate") and _zeros(put.operands[0]) and \
                s[b].type == s.type and put.results[0].type == s.type:
            return s.new("index_put", s[b], *put.operands[1:], **put.attrs)
    return None


def _repeated_heads(s: Site, value: Value) -> tuple[Value, int, bool] | None:
    """(x, n, whether x needs a reshape to drop its unit dim) when `value` repeats each head of
    k n times in a row: reshape(broadcast_to(x)) of [..., H*n, S, E] from x = [..., H, 1, S, E],
    x = expand_dims(k) at the unit axis (Hugging Face's `repeat_kv`) or any such value."""
    reshape = s.defined_by(value, "reshape")
    wide = s.defined_by(reshape.operands[0], "broadcast_to") if reshape is not None else None
    if wide is None or wide.results[0].type.rank < 4:
        return None
    x = wide.operands[0]
    *batch, heads, n, length, e = wide.results[0].type.shape
    if not (isinstance(heads, int) and isinstance(n, int)) or x.type.shape != (
            *batch, heads, 1, length, e) or value.type.shape != (*batch, heads * n, length, e):
        return None
    unit = s.defined_by(x, "expand_dims")
    if unit is not None and [a % x.type.rank for a in unit.attr("axes")] == [len(batch) + 1]:
        return unit.operands[0], n, False
    return x, n, True


def _fold_repeat_kv(s: Site) -> Value | None:
    k, v = (_repeated_heads(s, s[i]) for i in (1, 2))
    if k is None or v is None or k[1] != v[1] or s[0].type.rank != s[1].type.rank or \
            s[0].type.shape[-3] != s[1].type.shape[-3]:  # q's heads are the repeated ones
        return None
    k_v = [s.new("reshape", x, shape=(*x.type.shape[:-3], *x.type.shape[-2:])) if drop else x
           for x, _, drop in (k, v)]
    return s.new(s.op.name, s[0], *k_v, *s.op.operands[3:], **{**s.op.attrs, "enable_gqa": True})


def _identity_perm(s: Site) -> bool:
    perm = s.attr("perm")
    return list(perm) == sorted(perm)


def _unit_steps(s: Site) -> bool:
    return all(step == 1 for step in s.attr("steps"))


COMMUTATIVE = tuple(name for name, op in OPS.items() if "commutative" in op.traits)
IDEMPOTENT = ("max", "min", "and", "or")
REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_mean")

R = Rule
RULES: tuple[Rule, ...] = (
    R(COMMUTATIVE, "c op x -> x op c  (constants go right)", _swap_constant),
    R("add", "x + 0 -> x", lambda s: s.keep(s[0], s.zero(s[1], exact_sign=-0.0))),
    R("add", "index_put(0, v, i, accumulate) + y -> index_put(y, v, i, accumulate)",
      _accumulate_into),
    R("sub", "x - 0 -> x", lambda s: s.keep(s[0], s.zero(s[1], exact_sign=0.0))),
    R("sub", "x - x -> 0  (integers)", lambda s: s.zeros_if(s.integral and s[0] is s[1])),
    R("mul", "x * 1 -> x", lambda s: s.keep(s[0], s.splat(s[1], 1))),
    R("mul", "x * 0 -> 0  (integers)", lambda s: s.zeros_if(s.integral and s.zero(s[1]))),
    R("div", "x / 1 -> x", lambda s: s.keep(s[0], s.splat(s[1], 1))),
    R("pow", "x ** 1 -> x", lambda s: s.keep(s[0], s.splat(s[1], 1))),
    R(IDEMPOTENT, "max(x, x) -> x  (and min, and, or)", lambda s: s.keep(s[0], s[0] is s[1])),
    R("neg", "-(-x) -> x", lambda s: s.unwrap("neg")),
    R("abs", "|-x| -> |x|", lambda s: s.new("abs", s.unwrap("neg"))),
    R("abs", "||x|| -> |x|", lambda s: s.keep(s[0], s.unwrap("abs") is not None)),
    R("relu", "relu(relu(x)) -> relu(x)", lambda s: s.keep(s[0], s.unwrap("relu") is not None)),
    R("where", "where(c, x, x) -> x", lambda s: s.keep(s[1], s[1] is s[2])),
    R("where", "where(true, x, y) -> x", lambda s: s.keep(s[1], s.splat(s[0], True))),
    R("where", "where(false, x, y) -> y", lambda s: s.keep(s[2], s.splat(s[0], False))),
    R("transpose", "transpose(x, identity) -> x", lambda s: s.keep(s[0], _identity_perm(s))),
    R("transpose", "transpose(transpose(x, p), q) -> transpose(x, p[q])", _compose_transposes),
    R("reshape", "reshape(x) to x's shape -> x", lambda s: s[0]),
    R("reshape", "reshape(reshape(x)) -> reshape(x)", _reshape_chain),
    R("reshape", "reshape(transpose(x, p)) -> transpose(reshape(transpose(x, q)), swap last two)"
      "  (p = q, then the swap; leading dims reshaped)", _batch_reshape_first),
    R("broadcast_to", "broadcast_to(x) to x's shape -> x", lambda s: s[0]),
    R("cast", "cast(x: T, T) -> x", lambda s: s[0]),
    R("cast", "cast(cast(x: A, B), C) -> cast(x, C)  (B holds A exactly)", _cast_chain),
    R("squeeze", "squeeze(expand_dims(x, a), a) -> x", _undo("expand_dims")),
    R("expand_dims", "expand_dims(squeeze(x, a), a) -> x", _undo("squeeze")),
    R("slice", "x[0:n:1, ...] -> x  (keeps everything)", lambda s: s.keep(s[0], _unit_steps(s))),
    R("concat", "concat(x) -> x", lambda s: s.keep(s[0], len(s.op.operands) == 1)),
    R(REDUCTIONS, "reduce(x, axes=[]) -> x", lambda s: s.keep(s[0], s.attr("axes") == ())),
    R("scaled_dot_product_attention",
      "sdpa(q, repeat_kv(k), repeat_kv(v)) -> sdpa(q, k, v) {enable_gqa}", _fold_repeat_kv),
)

RULES_BY_OP: dict[str, tuple[Rule, ...]] = {
    name: tuple(rule for rule in RULES if name in rule.names) for name in OPS
}


@register_pass
class Canonicalize(Pass):
    """Apply algebraic identities and fold layout ops (reshape, transpose, cast chains)."""

    options = (
        Option(
            "max-iterations", int, 10, "sweeps over the function before giving up on a fixpoint"
        ),
        Option(
            "strict-signed-zeros",
            bool,
            False,
            "only rewrite float ops that keep the sign of zero (x + -0.0, x - 0.0)",
        ),
    )
    statistics = (
        Statistic("num-rewrites", "rules applied"),
        Statistic("num-erased", "dead ops erased"),
    )
    max_iterations: int
    strict_signed_zeros: bool

    def run_on_function(self, fn: Function) -> None:
        rewriter = Rewriter(fn)
        for _ in range(self.max_iterations):
            changed = False
            for op in list(fn.walk()):
                if op.parent is not None and self.rewrite(op, rewriter):
                    changed = True
            self.count("num-erased", rewriter.erase_dead())
            if not changed:
                return
        log.warning(
            "canonicalize: @%s did not converge in %d iterations", fn.name, self.max_iterations
        )

    def rewrite(self, op: Operation, rewriter: Rewriter) -> bool:
        """Apply the first rule that fits `op`; whether one did."""
        site = Site(op, rewriter, self.strict_signed_zeros)
        for rule in RULES_BY_OP[op.name]:
            try:
                value = rule.rewrite(site)
            except TilefoldError as exc:  # the rule built an op its operands do not fit
                log.debug("canonicalize: '%s' does not apply: %s", rule.identity, exc.message)
                continue
            if value is None or value.type != op.results[0].type:
                continue
            log.debug("canonicalize: %s on %%%s", rule.identity, op.results[0].name)
            rewriter.replace(op, [value])
            self.count("num-rewrites")
            return True
        return False
