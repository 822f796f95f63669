"""The math primitives that op-lowering rules emit and every kernel emitter implements.

A rule (`rules.py`) decomposes a graph op into these; the kernel IR's `Call` nodes and the row
programs' primitives are exactly this set, so a backend implements one list. `expensive` marks
what costs a polynomial or a library call (a kernel stores such a value rather than compute it
twice); comparisons and logic give booleans (i1 lanes in kernel IR, 0.0/1.0 in row programs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Primitive:
    arity: int
    boolean: bool = False  # the result is a boolean
    expensive: bool = False


_ARITH = dict.fromkeys(("add", "sub", "mul", "div", "max", "min"), Primitive(2))
_LOGIC = dict.fromkeys(("lt", "le", "gt", "ge", "eq", "ne", "and", "or"), Primitive(2, True))
_CHEAP = dict.fromkeys(("neg", "abs", "sqrt", "rsqrt", "reciprocal", "relu", "floor",
                        "round_bf16", "round_f16"), Primitive(1))
# exp_nonpositive: e**x for x <= 0 only (softmax's x - max), half of exp's work
_MATH = dict.fromkeys(("exp", "exp_nonpositive", "log", "tanh", "erf", "sigmoid", "silu", "gelu",
                       "gelu_tanh", "sin", "cos"), Primitive(1, expensive=True))

PRIMITIVES: dict[str, Primitive] = {
    **_ARITH, **_LOGIC, **_CHEAP, **_MATH,
    "pow": Primitive(2, expensive=True),
    "select": Primitive(3),  # cond ? x : y
}
BOOL_PRIMITIVES = frozenset(p for p, d in PRIMITIVES.items() if d.boolean)
EXPENSIVE_PRIMITIVES = frozenset(p for p, d in PRIMITIVES.items() if d.expensive)
