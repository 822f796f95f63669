"""A hypothesis strategy for graphs full of what the passes rewrite, and inputs to run them on.

`rewrite_graphs()` builds static functions from steps that plant identities (x + 0, x * 1,
double transposes, exact and lossy cast chains, squeeze/expand pairs, full slices), repeated
expressions, constant subgraphs and dead ops, so that canonicalize, cse, constant-fold and dce
all have work. `inputs()` draws arrays with the special values (NaN, inf, -0.0) that separate a
sound rewrite from a nearly sound one.
"""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import strategies as st

from tilefold.errors import TilefoldError
from tilefold.ir import Builder, Module, Tensor, TensorType

SPECIAL_FLOATS = (0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan)
SPECIAL_INTS = (0, 1, -1, 2, 3, -128, 127)


class Steps:
    """Each step appends ops to the builder from values in the pool and returns the result."""

    def __init__(self, draw, b: Builder, pool: list[Tensor]):
        self.draw = draw
        self.b = b
        self.pool = pool

    def pick(self, like: Tensor | None = None) -> Tensor:
        fits = [
            v for v in self.pool if like is None or (v.shape, v.dtype) == (like.shape, like.dtype)
        ]
        return self.draw(st.sampled_from(fits or self.pool))

    def scalar(self, x: Tensor) -> Tensor:
        special = SPECIAL_FLOATS if x.dtype.is_float else SPECIAL_INTS
        value = self.draw(st.sampled_from(special))
        shape = self.draw(st.sampled_from([(), x.shape, x.shape[-1:]]))
        return self.b.constant(np.full(shape, value, x.dtype.np_dtype))

    def binary(self) -> Tensor:
        x = self.pick()
        names = ["add", "sub", "mul", "max", "min"] + (["div", "pow"] if x.dtype.is_float else [])
        name = self.draw(st.sampled_from(names))
        y = self.scalar(x) if self.draw(st.booleans()) else self.pick(like=x)
        return self.b.op(name, *((y, x) if self.draw(st.booleans()) else (x, y)))

    def unary(self) -> Tensor:
        x = self.pick()
        names = ["neg", "abs", "relu"] + (["exp", "tanh"] if x.dtype.is_float else [])
        return self.b.op(self.draw(st.sampled_from(names)), x)

    def twice(self) -> Tensor:
        """f(f(x)) for an f whose second application cancels or repeats."""
        x = self.pick()
        name = self.draw(st.sampled_from(["neg", "abs", "relu"]))
        return self.b.op(name, self.b.op(self.draw(st.sampled_from(["neg", name])), x))

    def transposes(self) -> Tensor:
        x = self.pick()
        for _ in range(self.draw(st.integers(1, 3))):
            x = self.b.op("transpose", x, perm=self.draw(st.permutations(range(x.ndim))))
        return x

    def reshapes(self) -> Tensor:
        x = self.pick()
        flat = self.b.op("reshape", x, shape=(-1,))
        return self.b.op("reshape", flat, shape=self.draw(st.sampled_from([x.shape, (-1,)])))

    def casts(self) -> Tensor:
        x = self.pick()
        middle = self.draw(st.sampled_from(["f64", "f32", "f16", "bf16", "i64", "i32", "i8"]))
        y = self.b.op("cast", x, dtype=middle)
        return self.b.op("cast", y, dtype=self.draw(st.sampled_from([x.dtype.name, "f64"])))

    def dims(self) -> Tensor:
        x = self.pick()
        axis = self.draw(st.integers(0, x.ndim))
        y = self.b.op("expand_dims", x, axes=(axis,))
        return self.b.op("squeeze", y, axes=(self.draw(st.sampled_from([axis, 0])),))

    def layout_noops(self) -> Tensor:
        x = self.pick()
        choice = self.draw(st.integers(0, 3))
        if choice == 0:
            return self.b.op("broadcast_to", x, shape=x.shape)
        if choice == 1:
            return self.b.op("concat", x, axis=0)
        if choice == 2:
            return self.b.op(self.draw(st.sampled_from(["reduce_sum", "reduce_max"])), x, axes=())
        stops = [self.draw(st.sampled_from([d, d - 1 if d > 1 else d, 2**63 - 1])) for d in x.shape]
        return self.b.op("slice", x, starts=[0] * x.ndim, stops=stops, steps=[1] * x.ndim)

    def where(self) -> Tensor:
        x = self.pick()
        cond = self.b.constant(np.full(x.shape, self.draw(st.booleans())))
        if self.draw(st.booleans()):
            cond = self.b.op("lt", x, self.pick(like=x))
        return self.b.op("where", cond, x, self.pick(like=x))

    def constants(self) -> Tensor:
        """A subgraph of constants only, joined to a value."""
        x = self.pick()
        c = self.b.op(
            self.draw(st.sampled_from(["add", "mul", "max"])), self.scalar(x), self.scalar(x)
        )
        c = self.b.op(self.draw(st.sampled_from(["neg", "abs"])), c)
        return self.b.op("add", x, c)

    def repeat(self) -> Tensor:
        """An op the function already has, again: work for cse."""
        ops = [op for op in self.b.function.ops if op.name != "constant"]
        if not ops:
            return self.unary()
        op = self.draw(st.sampled_from(ops))
        operands = [Tensor(self.b, v) for v in op.operands]
        if op.has_trait("commutative") and self.draw(st.booleans()):
            operands.reverse()
        return self.b.op(op.name, *operands, **op.attrs)


# Steps by name; arithmetic and repeats twice as often as the rest.
STEP_NAMES = [n for n in vars(Steps) if not n.startswith("_") and n not in ("pick", "scalar")]
STEP_NAMES += ["binary", "repeat"]


@st.composite
def rewrite_graphs(draw, max_steps: int = 10) -> Module:
    """A verified static function `@main(%x, %y)` of 1 to `max_steps` steps."""
    dtype = draw(st.sampled_from(["f32", "f32", "f64", "i32"]))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    b = Builder("main")
    pool = [b.arg("x", dtype, shape), b.arg("y", dtype, shape)]
    steps = Steps(draw, b, pool)
    for _ in range(draw(st.integers(1, max_steps))):
        # A step whose drawn operands do not fit fails; its half-built ops stay, dead.
        with contextlib.suppress(TilefoldError):
            pool.append(getattr(steps, draw(st.sampled_from(STEP_NAMES)))())
    outputs = draw(st.lists(st.sampled_from(pool[2:] or pool), min_size=1, max_size=3))
    return b.build(*outputs)


@st.composite
def inputs(draw, types: list[TensorType]) -> list[np.ndarray]:
    """Arrays for `types` (static): random values with special ones mixed in."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = []
    for t in types:
        shape = tuple(int(d) for d in t.shape)
        if t.dtype.is_float:
            a = rng.standard_normal(shape) * 3
            mask = rng.random(shape) < 0.3
            a[mask] = rng.choice(SPECIAL_FLOATS, size=int(mask.sum()))
        else:
            a = rng.choice((*SPECIAL_INTS, 5, -7), size=shape)
        arrays.append(np.asarray(a).astype(t.dtype.np_dtype))
    return arrays
