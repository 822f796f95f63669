"""The op-lowering table: one rule per graph op, decomposing it into math primitives.

Every kernel generator builds its code from this table: memory-bound groups as kernel IR
(`codegen/kernel/from_graph.py`), GEMM epilogues as row programs (`codegen/rowprog/`). A rule
sees its operands already loaded and laid out by axis role (the consumer reads roles from
`tilefold.ir.axes`, never from shapes) and talks to the consumer through an explicit context:

    cx.call(prim, *xs)          a primitive of `primitives.PRIMITIVES`
    cx.const(c)                 a scalar constant
    cx.reduce(op, kind, x)      sum | max | min of x over the axes `op` reduces (axes.py)
    cx.inv_count(op)            1 / the number of elements `op` reduces (NaN for none)
    cx.scalar(op, i)            operand i's value when it is a constant scalar, else None

`flops` is what the cost model charges per result element. An op with a rule declares the
`lowered` trait in its IR declaration, which is what fusion reads (passes sit below codegen);
`tests/codegen_kernel/test_lowering_table.py` checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tilefold.errors import UnsupportedError
from tilefold.ir import Operation

ROUNDED = ("bf16", "f16")  # results rounded to their dtype after each op (math is f32)


class Context(Protocol):
    """What a rule may ask of the code it is lowered into (see the module docstring)."""

    def call(self, prim: str, *args: Any) -> Any: ...
    def const(self, value: float) -> Any: ...
    def reduce(self, op: Operation, kind: str, x: Any) -> Any: ...
    def inv_count(self, op: Operation) -> Any: ...
    def scalar(self, op: Operation, index: int) -> float | None: ...


Lower = Callable[[Context, Operation, list[Any]], Any]


@dataclass(frozen=True)
class Rule:
    lower: Lower
    flops: int = 1  # charged per result element by the cost model


def _same(prim: str) -> Lower:
    """The op is the primitive of that name."""
    return lambda cx, op, xs: cx.call(prim, *xs)


def _view(cx: Context, op: Operation, xs: list) -> Any:
    return xs[0]  # a layout op: axes.py has already lined its dims up with its operand's


def _gelu(cx: Context, op: Operation, xs: list) -> Any:
    return cx.call("gelu_tanh" if op.attr("approximate") == "tanh" else "gelu", *xs)


def _cast(cx: Context, op: Operation, xs: list) -> Any:
    """Between f32, bf16, f16 and bool, all held exactly in f32 math (bools as 0/1)."""
    src, dst = op.operands[0].type.dtype.name, op.attr("dtype").name
    x = cx.call("select", xs[0], cx.const(1.0), cx.const(0.0)) if src == "bool" else xs[0]
    if dst == "bool":
        return xs[0] if src == "bool" else cx.call("ne", x, cx.const(0.0))
    if dst in ROUNDED and src not in (dst, "bool"):  # 0 and 1 are exact in both
        return cx.call(f"round_{dst}", x)
    return x


def _pow(cx: Context, op: Operation, xs: list) -> Any:
    """x ** c for a constant c in {1, 2, 3, 4} as products (tanh-GELU's x ** 3), else pow."""
    x, y = xs
    c = cx.scalar(op, 1)
    if c not in (1.0, 2.0, 3.0, 4.0):
        return cx.call("pow", x, y)
    square = cx.call("mul", x, x) if c != 1.0 else x
    return {1.0: x, 2.0: square, 3.0: cx.call("mul", square, x),
            4.0: cx.call("mul", square, square)}[c]


def _log1p(cx: Context, t: Any) -> Any:
    """log(1 + t) for t >= 0 without losing t's digits when 1 + t rounds (Goldberg's trick:
    log(u) * t / (u - 1) for u = 1 + t, t itself where u == 1)."""
    u = cx.call("add", cx.const(1.0), t)
    d = cx.call("sub", u, cx.const(1.0))
    exact = cx.call("mul", cx.call("log", u), cx.call("div", t, d))
    return cx.call("select", cx.call("eq", d, cx.const(0.0)), t, exact)


def _softplus(cx: Context, op: Operation, xs: list) -> Any:
    """log(1 + e**z) / beta for z = beta x, as max(z, 0) + log1p(e**-|z|): no overflow, and
    e**z's digits kept where z << 0; x itself where z > threshold (as PyTorch)."""
    (x,) = xs
    beta = op.attr("beta")
    z = x if beta == 1.0 else cx.call("mul", x, cx.const(beta))
    s = cx.call("add", cx.call("max", z, cx.const(0.0)),
                _log1p(cx, cx.call("exp", cx.call("neg", cx.call("abs", z)))))
    s = s if beta == 1.0 else cx.call("div", s, cx.const(beta))
    return cx.call("select", cx.call("gt", z, cx.const(op.attr("threshold"))), x, s)


def _reduce(kind: str) -> Lower:
    return lambda cx, op, xs: cx.reduce(op, kind, xs[0])


def _mean(cx: Context, op: Operation, xs: list) -> Any:
    return cx.call("mul", cx.reduce(op, "sum", xs[0]), cx.inv_count(op))


def _softmax(cx: Context, op: Operation, xs: list) -> Any:
    # exp(x - max) / sum: one division per row, a product per element; x - max <= 0
    shifted = cx.call("sub", xs[0], cx.reduce(op, "max", xs[0]))
    total = cx.reduce(op, "sum", cx.call("exp_nonpositive", shifted))
    return cx.call("mul", cx.call("exp_nonpositive", shifted),
                   cx.call("div", cx.const(1.0), total))


def _log_softmax(cx: Context, op: Operation, xs: list) -> Any:
    shifted = cx.call("sub", xs[0], cx.reduce(op, "max", xs[0]))
    total = cx.reduce(op, "sum", cx.call("exp_nonpositive", shifted))
    return cx.call("sub", shifted, cx.call("log", total))


def _rstd(cx: Context, op: Operation, square_sum: Any) -> Any:
    """1 / sqrt(mean + eps) from a sum of squares over the normalized axes."""
    var = cx.call("mul", square_sum, cx.inv_count(op))
    return cx.call("rsqrt", cx.call("add", var, cx.const(op.attr("eps"))))


def _layer_norm(cx: Context, op: Operation, xs: list) -> Any:
    x, w, b = xs
    d = cx.call("sub", x, cx.call("mul", cx.reduce(op, "sum", x), cx.inv_count(op)))
    rstd = _rstd(cx, op, cx.reduce(op, "sum", cx.call("mul", d, d)))
    return cx.call("add", cx.call("mul", cx.call("mul", d, rstd), w), b)


def _rms_norm(cx: Context, op: Operation, xs: list) -> Any:
    x, w = xs
    rstd = _rstd(cx, op, cx.reduce(op, "sum", cx.call("mul", x, x)))
    return cx.call("mul", cx.call("mul", x, rstd), w)


# Ops that are the primitive of the same name, with their flops per element.
_PRIMITIVE_OPS = {
    "neg": 1, "abs": 1, "exp": 12, "log": 16, "sqrt": 4, "rsqrt": 4, "reciprocal": 1,
    "tanh": 20, "erf": 20, "sigmoid": 16, "relu": 1, "silu": 17, "sin": 20, "cos": 20,
    "floor": 1, "add": 1, "sub": 1, "mul": 1, "div": 4, "max": 1, "min": 1,
    "eq": 1, "ne": 1, "lt": 1, "le": 1, "gt": 1, "ge": 1, "and": 1, "or": 1,
}

RULES: dict[str, Rule] = {
    **{name: Rule(_same(name), flops) for name, flops in _PRIMITIVE_OPS.items()},
    "gelu": Rule(_gelu, 24),
    "softplus": Rule(_softplus, 40),
    "pow": Rule(_pow, 30),
    "where": Rule(_same("select")),
    "cast": Rule(_cast),
    **dict.fromkeys(("expand_dims", "squeeze", "transpose", "broadcast_to"), Rule(_view)),
    "reduce_sum": Rule(_reduce("sum")),
    "reduce_max": Rule(_reduce("max")),
    "reduce_min": Rule(_reduce("min")),
    "reduce_mean": Rule(_mean),
    "softmax": Rule(_softmax, 18),
    "log_softmax": Rule(_log_softmax, 22),
    "layer_norm": Rule(_layer_norm, 8),
    "rms_norm": Rule(_rms_norm, 5),
}


def lower_op(cx: Context, op: Operation, xs: list) -> Any:
    """`op` applied to the lowered operands `xs`, rounded to a bf16/f16 result's dtype."""
    rule = RULES.get(op.name)
    if rule is None:
        raise UnsupportedError(f"op '{op.name}' has no lowering rule (codegen/lower/rules.py); "
                               "it cannot be part of a generated kernel")
    out = rule.lower(cx, op, xs)
    dtype = op.results[0].type.dtype.name
    if dtype in ROUNDED and op.name != "cast" and out is not xs[0]:
        out = cx.call(f"round_{dtype}", out)
    return out


def op_flops(name: str) -> int:
    """Flops per result element the cost model charges for op `name` (1 without a rule)."""
    rule = RULES.get(name)
    return rule.flops if rule is not None else 1
