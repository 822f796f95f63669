"""Graph IR group -> kernel IR: elementwise, reduce, softmax and norm ops become one loop nest.

`analyze_group` finds the group's iteration space once: every tensor dim joins an axis class
(union-find over how ops align dims), reductions name the classes they reduce, and each value
becomes an expression over buffers. `Group.kernel(layout)` then builds the loop nest for one
concrete layout (sizes and strides known, size-1 axes dropped, compatible axes merged):

    for outer axes:                          (parallel, or vector when contiguous: vertical)
      for reduced axes reduce(level-1 ...)   (max for softmax, sum for mean)
      for reduced axes reduce(level-2 ...)   (sum of exp(x - max), sum of (x - mean)**2)
      for reduced axes { full-size stores }
      reduced-size stores

Values that do not vary inside a loop are hoisted to `Let`s before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tilefold.codegen.kernel.ir import (
    Axis,
    Buffer,
    Call,
    Const,
    Dim,
    Expr,
    Kernel,
    Let,
    Load,
    Loop,
    Reduction,
    Ref,
    Stmt,
    Store,
    map_expr,
    verify_kernel,
    walk_expr,
)
from tilefold.codegen.lower import EXPENSIVE_PRIMITIVES, RULES, lower_op
from tilefold.errors import UnsupportedError
from tilefold.ir import Block, Function, Operation, Value
from tilefold.ir.axes import AxisClasses, is_one
from tilefold.ir.types import Dim as IRDim

KERNEL_DTYPES = {"f32", "bf16", "f16", "bool"}


@dataclass(frozen=True)
class BufferSpec:
    """A group input, hidden constant or output, and the axis class of each of its dims."""

    name: str
    dtype: str
    classes: tuple[int | None, ...]  # None: a size-1 dim that broadcasts
    output: bool
    value: np.ndarray | None = None  # hidden constants


@dataclass
class Group:
    """A memory-bound group analyzed once; `kernel` lowers it for one concrete layout."""

    name: str
    classes: list[int]  # axis classes in loop order
    sizes: dict[int, IRDim]
    reduced: frozenset[int]
    buffers: list[BufferSpec]
    outputs: dict[str, Value]  # output buffer -> value
    exprs: dict[Value, Expr] = field(default_factory=dict)
    reductions: list[tuple[Reduction, int, Operation]] = field(default_factory=list)
    value_classes: dict[Value, tuple[int | None, ...]] = field(default_factory=dict)
    copies: set[Operation] = field(default_factory=set)  # reductions of one element each

    def kernel(self, layout: Layout, stash: str | None = "output") -> Kernel:
        """The loop nest for `layout`; `stash` ("output", "scratch" or None) says where the
        expensive per-element values of the last reduction pass wait for the final pass
        (see `_stash`); None recomputes them."""
        return _build_kernel(self, layout, stash)


@dataclass(frozen=True)
class Layout:
    """One call's geometry: kernel axes (merged classes) and every buffer's strides on them."""

    axes: tuple[tuple[int, ...], ...]  # classes merged into each kernel axis, outer first
    reduced: tuple[bool, ...]
    strides: tuple[tuple[int | None, ...], ...]  # per buffer, per axis (None: run time)

    def axis_name(self, i: int) -> str:
        return "r" + "_".join(map(str, self.axes[i])) if self.reduced[i] else \
            "i" + "_".join(map(str, self.axes[i]))


# Ops `_build_exprs` lowers: the lowering table's, and constants (data, not math).
LOWERED = frozenset(RULES) | {"constant"}


def _group_parts(group: Function | Block) -> tuple[str, list[Value], list[Operation], list[Value]]:
    if isinstance(group, Function):
        return group.name, list(group.args), [op for op in group.ops if op is not
                                              group.return_op], group.outputs
    term = group.terminator
    return "fused", list(group.args), [op for op in group.ops if op is not term], \
        list(term.operands) if term is not None else []


def analyze_group(group: Function | Block) -> Group:
    """The iteration space, reductions and per-value expressions of a memory-bound group."""
    name, args, ops, outputs = _group_parts(group)
    values = list(args) + [r for op in ops for r in op.results]
    for v in values:
        if v.type.dtype.name not in KERNEL_DTYPES:
            raise UnsupportedError(
                f"%{v.name}: {v.type} - kernels compute in f32 over f32/bf16/f16/bool data"
            )
    uf = AxisClasses()
    reduced_pairs: list[frozenset] = []
    for op in ops:
        if op.name not in LOWERED:
            raise UnsupportedError(f"op '{op.name}' cannot be part of a memory-bound kernel")
        reduced_pairs.append(uf.align(op))
    roots: dict[tuple[Value, int], int] = {}
    classes_of: dict[Value, tuple[int | None, ...]] = {}
    sizes: dict[int, IRDim] = {}
    for v in values:
        cls = []
        for j, d in enumerate(v.type.shape):
            c = roots.setdefault(uf.find((v, j)), len(roots))
            if not is_one(d) or sizes.get(c) in (None, 1):
                sizes[c] = d if not isinstance(sizes.get(c), int) or is_one(sizes[c]) else sizes[c]
            cls.append(c)
        if len(set(cls)) != len(cls):
            raise UnsupportedError(
                f"%{v.name} is indexed along one axis by two of its dims (e.g. x + x.T); "
                "materialize the transpose first"
            )
        classes_of[v] = tuple(cls)
    # Dims of size 1 are dropped from the loop nest, so they take no part in what a reduction
    # reduces (a kept dim and the dim it came from are different classes, both of size 1); a
    # reduce_* over such dims only is a copy of its operand.
    reduced_sets, copies = set(), set()
    for op, pairs in zip(ops, reduced_pairs, strict=True):
        live = frozenset(c for c in (roots[uf.find(p)] for p in pairs) if sizes[c] != 1)
        if pairs and not live and _is_reduce(op):
            copies.add(op)
        elif pairs:
            reduced_sets.add(live)
    if len(reduced_sets) > 1:
        raise UnsupportedError(
            f"@{name} reduces over different axes ({len(reduced_sets)} sets); a kernel reduces "
            "over one set of axes: split the group"
        )
    widest = max(values, key=lambda v: (len(set(classes_of[v])), values.index(v)))
    order = list(classes_of[widest])
    order += [c for c in range(len(roots)) if c not in order]
    grp = Group(name, order, sizes, next(iter(reduced_sets), frozenset()), [], {},
                value_classes=classes_of, copies=copies)
    _build_exprs(grp, args, ops, outputs)
    return grp


def _buffer_classes(grp: Group, v: Value) -> tuple[int | None, ...]:
    return tuple(None if is_one(d) else c for d, c in zip(v.type.shape, grp.value_classes[v],
                                                             strict=True))


def _is_reduce(op: Operation) -> bool:
    """A reduce_* op (its result drops or keeps the reduced axes), as opposed to softmax or a
    norm (the `normalizing` trait: its result has its operand's shape)."""
    return op.has_trait("reduction") and not op.has_trait("normalizing")


class _ExprContext:
    """The lowering table's context (`codegen/lower/rules.py`) for kernel IR expressions:
    a reduction becomes a `Reduction` run in the loop pass after the ones it reads."""

    def __init__(self, grp: Group, ex: dict[Value, Expr]):
        self.grp = grp
        self.ex = ex
        self.level: dict[str, int] = {}

    def call(self, prim: str, *xs: Expr) -> Expr:
        return Call(prim, tuple(xs))

    def const(self, value: float) -> Expr:
        return Const(value)

    def reduce(self, op: Operation, kind: str, value: Expr) -> Expr:
        name = f"t{len(self.grp.reductions)}"
        refs = [self.level.get(e.name, 0) for e in walk_expr(value) if isinstance(e, Ref)]
        self.level[name] = 1 + max(refs, default=0)
        self.grp.reductions.append((Reduction(name, kind, value), self.level[name], op))
        return Ref(name)

    def inv_count(self, op: Operation) -> Expr:
        return Call("div", (Const(1.0), Ref("n")))  # the group reduces one set of axes

    def scalar(self, op: Operation, index: int) -> float | None:
        e = self.ex[op.operands[index]]
        return e.value if isinstance(e, Const) else None


def _build_exprs(grp: Group, args: list[Value], ops: list[Operation], outputs: list[Value]) -> None:
    ex = grp.exprs
    for i, a in enumerate(args):
        grp.buffers.append(BufferSpec(f"in{i}", a.type.dtype.name, _buffer_classes(grp, a), False))
        ex[a] = Load(f"in{i}")
    cx = _ExprContext(grp, ex)
    for op in ops:
        out = op.results[0]
        if op.name == "constant":
            arr = np.asarray(op.attr("value"))
            if arr.size and np.all(arr == arr.flat[0]) and arr.dtype != np.bool_:
                ex[out] = Const(float(arr.flat[0]))
            else:
                buf = f"c{len(grp.buffers)}"
                grp.buffers.append(BufferSpec(buf, out.type.dtype.name,
                                              _buffer_classes(grp, out), False, arr))
                ex[out] = Load(buf)
        elif op in grp.copies:  # a reduction of one element per result
            ex[out] = ex[op.operands[0]]
        else:
            ex[out] = lower_op(cx, op, [ex[v] for v in op.operands])
    for i, v in enumerate(outputs):
        buf = f"out{i}"
        grp.buffers.append(BufferSpec(buf, v.type.dtype.name, _buffer_classes(grp, v), True))
        grp.outputs[buf] = v


# --- lowering for one layout ------------------------------------------------------------
def _subst(expr: Expr, names: dict[str, Expr]) -> Expr:
    return map_expr(expr, lambda e: names.get(e.name) if isinstance(e, Ref) else None)


class _Hoister:
    """Pulls subexpressions that do not vary along a loop's axes out into `Let`s."""

    def __init__(self, kernel_axes: tuple[Axis, ...], buffers: dict[str, Buffer]):
        self.axes = [a.name for a in kernel_axes]
        self.buffers = buffers
        self.lets: dict[Expr, str] = {}

    def varies(self, expr: Expr, loop_axes: set[str]) -> bool:
        for e in walk_expr(expr):
            if isinstance(e, Load):
                strides = self.buffers[e.buffer].strides
                if any(s != 0 and a in loop_axes for a, s in zip(self.axes, strides,
                                                                 strict=True)):
                    return True
        return False

    def hoist(self, expr: Expr, loop_axes: set[str], out: list[Stmt]) -> Expr:
        def invariant(e: Expr) -> Expr | None:
            if isinstance(e, Const | Ref | Dim) or self.varies(e, loop_axes):
                return None
            if e not in self.lets:
                self.lets[e] = f"v{len(self.lets)}"
                out.append(Let(self.lets[e], e))
            return Ref(self.lets[e])

        return map_expr(expr, invariant)


def _replace(expr: Expr, old: Expr, new: Expr) -> Expr:
    return map_expr(expr, lambda e: new if e == old else None)


def _stash(body: list[Stmt], outputs: list[tuple[str, Expr]], buffers: dict[str, Buffer],
           into: str, axes: tuple[str, ...], inner: tuple[str, ...]
           ) -> tuple[list[tuple[str, Expr]], list[Buffer]]:
    """Store an expensive value the last reduction loop computes (softmax's exp(x - max))
    and read it back in the final loop instead of recomputing it: one transcendental per
    element instead of two, at the cost of an L1/L2 re-read. `into` "output" keeps it in
    the f32 output it feeds; "scratch" in a row of its own (new buffers, returned), so an
    output streamed past the caches is written once, never stored and then reloaded."""
    at = max(i for i, st in enumerate(body) if isinstance(st, Loop))
    loop = body[at]
    assert isinstance(loop, Loop)
    computed = {e for r in loop.reductions for e in walk_expr(r.value)}
    # A row over the inner axes, dense: the last has stride 1, the others run-time ones.
    row = tuple(0 if a not in inner else 1 if a == inner[-1] else None for a in axes)
    stores = list(loop.body)
    result, rows = [], {}
    for buf, expr in outputs:
        found = [e for e in walk_expr(expr) if isinstance(e, Call)
                 and e.op in EXPENSIVE_PRIMITIVES and e in computed]
        if found and into == "scratch":
            if found[-1] not in rows:
                rows[found[-1]] = Buffer(f"stash{len(rows)}", "f32", row, scratch=True)
                stores.append(Store(rows[found[-1]].name, found[-1]))
            expr = _replace(expr, found[-1], Load(rows[found[-1]].name))
        elif found and buffers[buf].dtype == "f32":
            stores.append(Store(buf, found[-1]))
            expr = _replace(expr, found[-1], Load(buf))
        result.append((buf, expr))
    body[at] = Loop(loop.axes, tuple(stores), loop.reductions)
    return result, list(rows.values())


def _build_kernel(grp: Group, layout: Layout, stash: str | None = "output") -> Kernel:
    axes = tuple(Axis(layout.axis_name(i)) for i in range(len(layout.axes)))
    buffers = tuple(
        Buffer(spec.name, spec.dtype, strides, spec.output)
        for spec, strides in zip(grp.buffers, layout.strides, strict=True)
    )
    by_name = {b.name: b for b in buffers}
    outer = tuple(a.name for a, red in zip(axes, layout.reduced, strict=True) if not red)
    inner = tuple(a.name for a, red in zip(axes, layout.reduced, strict=True) if red)
    n_expr: Expr = Const(1.0)
    for a in inner:
        n_expr = Dim(a) if n_expr == Const(1.0) else Call("mul", (n_expr, Dim(a)))
    names = {"n": n_expr}
    hoister = _Hoister(axes, by_name)
    body: list[Stmt] = []
    levels = sorted({lvl for _, lvl, _ in grp.reductions})
    inner_set = set(inner)
    for lvl in levels:
        reds = tuple(
            Reduction(r.name, r.op, hoister.hoist(_subst(r.value, names), inner_set, body))
            for r, lv, _ in grp.reductions if lv == lvl
        )
        body.append(Loop(inner, (), reds))
    full, partial = [], []
    for buf, v in grp.outputs.items():
        expr = _subst(grp.exprs[v], names)
        varies = any(s != 0 and a in inner_set
                     for a, s in zip((x.name for x in axes), by_name[buf].strides, strict=True))
        (full if varies else partial).append((buf, expr))
    if full:
        hoisted = [(buf, hoister.hoist(e, inner_set, body)) for buf, e in full]
        if stash and levels:
            hoisted, rows = _stash(body, hoisted, by_name, stash, tuple(a.name for a in axes),
                                   inner)
            buffers += tuple(rows)
        body.append(Loop(inner, tuple(Store(buf, e) for buf, e in hoisted)))
    body.extend(Store(buf, hoister.hoist(e, set(), body)) for buf, e in partial)
    stmts: tuple[Stmt, ...] = (Loop(outer, tuple(body)),) if outer else tuple(body)
    return verify_kernel(Kernel(grp.name, axes, buffers, stmts))


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements, 0 along size-1 dims; a size-0 dim counts as a size-1
    one, so an empty buffer lays out as a non-empty one does (NumPy reports all-0 strides for
    an empty array, which would make it look broadcast along every axis)."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(0 if d == 1 else step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def element_strides(a: np.ndarray) -> tuple[int, ...]:
    """`a`'s strides in elements, 0 along size-1 dims; an empty array has no memory to walk
    and takes `row_major_strides` of its shape."""
    if a.size == 0:
        return row_major_strides(a.shape)
    return tuple(0 if n == 1 else s // a.itemsize for n, s in zip(a.shape, a.strides,
                                                                     strict=True))


def contiguous_layout(grp: Group) -> Layout:
    """The layout when every buffer is row-major (symbolic sizes taken as 2: not 1, merged
    like any other size)."""
    sizes = {c: d if isinstance(d, int) else 2 for c, d in grp.sizes.items()}
    strides = [row_major_strides(tuple(1 if c is None else sizes[c] for c in spec.classes))
               for spec in grp.buffers]
    return make_layout(grp, sizes, strides)[0]


def make_layout(
    grp: Group, sizes: dict[int, int], strides: list[tuple[int, ...]]
) -> tuple[Layout, list[int], list[list[int]]]:
    """Drop size-1 classes, merge neighbours every buffer walks as one, and put the axis most
    buffers walk contiguously last within the outer and the reduced axes.

    `strides` are in elements, per buffer per dim. Strides other than 0 and 1 become run-time
    parameters (None) so that one compiled kernel serves every shape with the same pattern.
    Returns the layout, each kernel axis' size and each buffer's stride per kernel axis.
    """
    live = [c for c in grp.classes if sizes[c] != 1]
    per_buffer = []
    for spec, st in zip(grp.buffers, strides, strict=True):
        by_class = dict.fromkeys(live, 0)
        for c, s in zip(spec.classes, st, strict=True):
            if c is not None and c in by_class:
                by_class[c] = s
        per_buffer.append(by_class)
    groups = []
    for reduced in (False, True):
        members = [c for c in live if (c in grp.reduced) == reduced]
        merged: list[list[int]] = []
        for c in members:
            if merged and all(b[merged[-1][-1]] == b[c] * sizes[c] for b in per_buffer):
                merged[-1].append(c)
                for b in per_buffer:
                    b[merged[-1][0]] = b[c]
            else:
                merged.append([c])
        unit = [sum(b[m[0]] == 1 for b in per_buffer) for m in merged]
        if merged:
            best = max(range(len(merged)), key=lambda i: (unit[i], i))
            merged.append(merged.pop(best))
        groups += [(tuple(m), reduced) for m in merged]

    def cls(s: int) -> int | None:
        return s if s in (0, 1) else None

    layout = Layout(
        tuple(g for g, _ in groups),
        tuple(r for _, r in groups),
        tuple(tuple(cls(b[g[0]]) for g, _ in groups) for b in per_buffer),
    )
    axis_sizes = [math.prod(sizes[c] for c in g) for g, _ in groups]
    return layout, axis_sizes, [[b[g[0]] for g, _ in groups] for b in per_buffer]
