"""Hypothesis strategies for the IR tests: arrays of every dtype bit for bit, and random graphs.

`modules(focus=...)` builds random valid modules from the op table: each op gets operands from
the values built so far or from fresh arguments (static, symbolic and strided types), attributes
drawn by their declared kind, and a source location now and then. Only declarations are read;
a few hints (which operand must be bool, what makes a permutation) raise the share of draws
that the op accepts, and a draw it rejects is simply not added.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from tilefold import dtypes
from tilefold.errors import Location, TilefoldError
from tilefold.ir import OPS, Builder, Module, SymDim, Tensor, TensorType
from tilefold.ir.ops.shape import BEGIN, END

CORE_MODULES = {
    f"tilefold.ir.ops.{name}"
    for name in ("control", "elementwise", "linalg", "nn", "reduce", "shape")
}
# The first op set: every op the IR core declares (terminators aside).
CORE_OPS = sorted(
    name
    for name, op in OPS.items()
    if op.__module__ in CORE_MODULES and "terminator" not in op.traits
)
# Ops a random graph may contain: every declared op without regions.
GRAPH_OPS = sorted(
    name for name, op in OPS.items() if op.regions == 0 and "terminator" not in op.traits
)
SYMBOLS = ("b", "n", "seq_len")
SYMBOL_SIZES = {"b": 2, "n": 3, "seq_len": 1}

NAME_CHARS = "abcxyzABZ0123456789_.$-"
names = st.text(NAME_CHARS, min_size=1, max_size=6)
locations = st.builds(
    Location,
    st.text(min_size=0, max_size=12),
    st.integers(1, 10**6),
    st.integers(1, 500),
)


# -- arrays ------------------------------------------------------------------------------------


@st.composite
def bit_arrays(draw, dt: dtypes.DType, shape: tuple[int, ...]) -> np.ndarray:
    """An array of `dt` from arbitrary bit patterns: every NaN payload, inf, -0.0, subnormal.

    Sub-byte types (i4, fp4e2m1) and bool get only their meaningful bits.
    """
    count = int(np.prod(shape))
    if dt.kind == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), bool)
    if dt.bits < 8:
        nibbles = draw(st.lists(st.integers(0, 15), min_size=count, max_size=count))
        codes = np.array(nibbles, np.uint8)
        if dt.kind == "int":
            return (codes.astype(np.int64) - 16 * (codes >= 8)).astype(dt.np_dtype).reshape(shape)
        return codes.view(dt.np_dtype).reshape(shape)
    raw = draw(st.binary(min_size=count * dt.itemsize, max_size=count * dt.itemsize))
    return np.frombuffer(raw, dtype=dt.np_dtype).reshape(shape).copy()


def random_array(rng: np.random.Generator, t: TensorType, sizes=SYMBOL_SIZES) -> np.ndarray:
    """A random input for type `t` (symbolic dims sized by `sizes`), never only zeros or ones."""
    shape = tuple(sizes[d.name] if isinstance(d, SymDim) else d for d in t.shape)
    dt = t.dtype
    if dt.kind == "bool":
        return rng.random(shape) < 0.5
    if dt.is_integer:
        lo, hi = (-8, 8) if dt.kind == "int" else (0, 16)
        return rng.integers(lo, hi, shape).astype(dt.np_dtype)
    scale = 2.0 if dt.bits > 4 else 1.0
    return (rng.standard_normal(shape) * scale).astype(dt.np_dtype)


# -- types and attributes ----------------------------------------------------------------------

float_dtypes = st.sampled_from([d for d in dtypes.ALL_DTYPES if d.is_float])
all_dtypes = st.sampled_from(dtypes.ALL_DTYPES)
dims = st.one_of(st.integers(0, 4), st.sampled_from(SYMBOLS).map(SymDim))


@st.composite
def tensor_types(draw, dtype=None, shape=None) -> TensorType:
    dt = draw(all_dtypes) if dtype is None else dtype
    if shape is None:
        shape = tuple(draw(st.lists(dims, max_size=3)))
    strides = None
    if draw(st.integers(0, 7)) == 0:
        strides = draw(st.lists(st.integers(-64, 64), min_size=len(shape), max_size=len(shape)))
    return TensorType.of(dt, shape, strides)


@st.composite
def _slice_params(draw, x: TensorType):
    """(starts, stops, steps) for `x`: symbolic dims whole or reversed, static ones anything."""
    starts, stops, steps = [], [], []
    for d in x.shape:
        if isinstance(d, SymDim):
            start, stop, step = draw(st.sampled_from([(0, END, 1), (-1, BEGIN, -1)]))
        else:
            bounds = st.one_of(st.integers(-6, 6), st.sampled_from([END, BEGIN]))
            start, stop = draw(bounds), draw(bounds)
            step = draw(st.integers(-3, 3).filter(bool))
        starts.append(start)
        stops.append(stop)
        steps.append(step)
    return starts, stops, steps


@st.composite
def _reshape_target(draw, x: TensorType):
    """A target shape with x's element count: reordered, a 1 inserted, or one dim as -1."""
    shape = list(x.shape)
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return shape[::-1]
    if choice == 1:
        shape.insert(draw(st.integers(0, len(shape))), 1)
        return shape
    if not shape:
        return [-1]
    shape[draw(st.integers(0, len(shape) - 1))] = -1
    return shape


@st.composite
def _broadcast_target(draw, x: TensorType):
    lead = draw(st.lists(dims, max_size=2))
    rest = [draw(dims) if d == 1 else d for d in x.shape]
    return lead + rest


def attribute_values(op: str, key: str, spec, x: TensorType | None):
    """A strategy for attribute `key` of `op`, given its first operand's type `x`."""
    rank = x.rank if x is not None else 0
    if (op, key) in (("slice", "starts"), ("slice", "stops"), ("slice", "steps")):
        raise AssertionError("slice parameters are drawn together")
    if spec.kind == "int":
        return st.one_of(st.integers(-rank - 1, rank), st.integers(-(2**63), 2**63 - 1))
    if spec.kind == "float":
        return st.one_of(st.floats(1e-12, 1e-2), st.floats())
    if spec.kind == "bool":
        return st.booleans()
    if spec.kind == "str":
        return st.sampled_from(spec.choices) if spec.choices else st.text(max_size=10)
    if spec.kind == "ints":
        perms = st.permutations(list(range(rank)))
        expand = st.lists(st.integers(-rank - 1, rank), max_size=2, unique=True)
        axes = st.lists(st.integers(-rank, rank - 1), unique_by=lambda a: a % rank)
        return st.one_of(perms, axes if rank else st.just([]), expand)
    if spec.kind == "shape":
        if x is None:
            return st.lists(st.integers(0, 4), max_size=3)
        return st.one_of(_reshape_target(x), _broadcast_target(x))
    if spec.kind == "dtype":
        return all_dtypes
    assert spec.kind == "dense", spec.kind
    return st.tuples(all_dtypes, st.lists(st.integers(0, 3), max_size=2)).flatmap(
        lambda ds: bit_arrays(ds[0], tuple(ds[1]))
    )


# -- graphs ------------------------------------------------------------------------------------

# Operand dtypes some ops insist on, by position (None: same as the first operand).
OPERAND_DTYPES = {
    "where": [dtypes.boolean, None, None],
    "gather": [None, dtypes.i32],
    "and": [dtypes.boolean, dtypes.boolean],
    "or": [dtypes.boolean, dtypes.boolean],
}


class GraphDrawer:
    """Adds random ops to one function through a Builder, drawing from hypothesis `draw`."""

    def __init__(self, draw, builder: Builder):
        self.draw = draw
        self.b = builder
        self.pool: list[Tensor] = []

    def fresh_arg(self, t: TensorType) -> Tensor:
        taken = {v.name for v in self.b.function.values()}
        name = self.draw(names)
        while name in taken:
            name += "_"
        arg = self.b.arg(name, t.dtype, t.shape, t.strides)
        self.pool.append(arg)
        return arg

    def operand(self, want: dtypes.DType | None, shape: tuple | None) -> Tensor:
        """A pool value of dtype `want` and `shape` (None: any), or a fresh argument of that type.

        Fresh first operands are floats half the time: most ops want floats.
        """
        draw = self.draw
        fits = [
            v
            for v in self.pool
            if (want is None or v.dtype == want) and (shape is None or v.shape == shape)
        ]
        if fits and draw(st.booleans()):
            return draw(st.sampled_from(fits))
        dtype = want or draw(st.one_of(float_dtypes, all_dtypes))
        return self.fresh_arg(draw(tensor_types(dtype=dtype, shape=shape)))

    def add_op(self, name: str) -> Tensor | None:
        """Try to append op `name`; None when the drawn operands or attributes do not fit it."""
        draw, opdef = self.draw, OPS[name]
        if name == "constant":
            value = draw(attribute_values(name, "value", opdef.attributes["value"], None))
            return self.remember(self.b.constant(value))
        lo, hi = opdef.arity()
        count = lo if hi == lo else draw(st.integers(max(lo, 1), lo + 2))
        wanted = OPERAND_DTYPES.get(name, [])
        operands: list[Tensor] = []
        cut = draw(st.integers(0, 3))  # later operands take the first one's shape from dim `cut`
        for i in range(count):
            want = wanted[i] if i < len(wanted) else None
            if not operands:
                operands.append(self.operand(want, None))
                continue
            first = operands[0]
            operands.append(self.operand(want or first.dtype, first.shape[cut:]))
        x = operands[0].type if operands else None
        attrs = {}
        if name == "slice" and x is not None:
            attrs["starts"], attrs["stops"], attrs["steps"] = draw(_slice_params(x))
        for key, spec in opdef.attributes.items():
            if key not in attrs and (spec.required or draw(st.booleans())):
                attrs[key] = draw(attribute_values(name, key, spec, x))
        self.b.loc = draw(st.none() | locations)
        try:
            return self.remember(self.b.op(name, *operands, **attrs))
        except TilefoldError:
            return None

    def remember(self, result):
        results = result if isinstance(result, list) else [result]
        unbound = set().union(*(r.type.symbols for r in results)) - set().union(
            *(a.type.symbols for a in self.b.function.args)
        )
        if unbound:  # e.g. broadcast_to a symbol no argument defines: not a valid graph
            results[0].value.defining_op.erase()
            return None
        self.pool.extend(results)
        return results[0]


@st.composite
def modules(draw, focus: str | None = None, max_ops: int = 6) -> Module:
    """A random verified module of 1-2 functions; with `focus`, its first function uses that op."""
    module = Module(draw(st.none() | names))
    function_names = draw(st.lists(names, min_size=1, max_size=2, unique=True))
    for index, fn_name in enumerate(function_names):
        b = Builder(fn_name, module)
        b.function.loc = draw(st.none() | locations)
        graph = GraphDrawer(draw, b)
        for _ in range(draw(st.integers(0, 2))):
            graph.fresh_arg(draw(tensor_types()))
        if focus is not None and index == 0:
            assume(any(graph.add_op(focus) is not None for _ in range(8)))
        for _ in range(draw(st.integers(0 if graph.pool else 1, max_ops))):
            graph.add_op(draw(st.sampled_from(GRAPH_OPS)))
        assume(graph.pool)
        b.loc = draw(st.none() | locations)
        b.build(*draw(st.lists(st.sampled_from(graph.pool), min_size=1, max_size=3)))
    return module
