"""Kernel IR: a target-neutral loop nest over one iteration space, for a fused memory-bound group.

A `Kernel` names its axes (static or run-time sizes) and its buffers; a buffer is indexed
implicitly by the enclosing loop indices through one element stride per axis (0 = broadcast,
None = known at run time). The body is a tree of statements:

    Loop(axes, body, reductions)  perfectly nested loops; reductions accumulate over all of them
                                  and are bound by name after the loop
    Let(name, value)              a named value, invariant in the loops not yet entered
    Store(buffer, value)          writes the element at the current indices

Expressions (`Load`, `Const`, `Dim`, `Ref`, `Call`) are frozen trees, compared by value, so a
code generator can reuse a subexpression computed once per loop body. All math is f32; loads
widen bf16/f16 and bool (i1), stores narrow. How the loops run (vector width, masked tails,
unrolling, threads) is a separate `Schedule`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tilefold.codegen.lower.primitives import BOOL_PRIMITIVES, PRIMITIVES
from tilefold.errors import TilefoldError

# Call ops are the lowering table's primitives: op -> number of operands; comparisons and
# logic give booleans, everything else f32.
CALL_OPS: dict[str, int] = {name: p.arity for name, p in PRIMITIVES.items()}
BOOL_OPS = BOOL_PRIMITIVES
REDUCE_OPS = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}  # op -> identity
DTYPES = ("f32", "bf16", "f16", "bool")


@dataclass(frozen=True)
class Axis:
    name: str
    size: int | None = None  # None: passed at run time


@dataclass(frozen=True)
class Buffer:
    """An array the kernel reads (input), writes (output), or writes and reads back (scratch:
    a row the kernel keeps between two sweeps, with stride 0 along the axes outside the
    sweep). Scratch memory comes from the caller, one slice per thread: thread t's starts
    `slice` elements (a run-time parameter) after thread t - 1's."""

    name: str
    dtype: str
    strides: tuple[int | None, ...]  # one per kernel axis, in elements; None: run time
    output: bool = False
    scratch: bool = False


@dataclass(frozen=True)
class Load:
    """The element of `buffer` at the current indices of the loops around it (f32 in
    registers, whatever the buffer holds)."""

    buffer: str


@dataclass(frozen=True)
class Const:
    """An f32 literal."""

    value: float


@dataclass(frozen=True)
class Dim:
    """The size of an axis, as f32 (e.g. the element count of a mean)."""

    axis: str


@dataclass(frozen=True)
class Ref:
    """The value a `Let` or a finished `Reduction` bound to `name`."""

    name: str


@dataclass(frozen=True)
class Call:
    """An op on subexpressions. Trees share subtrees (layer_norm's centred value feeds both
    the variance and the output), so the hash is computed once, not once per path."""

    op: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if CALL_OPS.get(self.op) != len(self.args):
            raise TilefoldError(f"kernel IR: {self.op} with {len(self.args)} operands")
        object.__setattr__(self, "_hash", hash((self.op, self.args)))

    def __hash__(self) -> int:
        return self._hash


Expr = Load | Const | Dim | Ref | Call


@dataclass(frozen=True)
class Reduction:
    name: str
    op: str  # sum | max | min
    value: Expr
    init: float | None = None  # None: the op's identity

    @property
    def start(self) -> float:
        return REDUCE_OPS[self.op] if self.init is None else self.init


@dataclass(frozen=True)
class Let:
    """Bind `value`, computed once here, to `name` for the statements after it."""

    name: str
    value: Expr


@dataclass(frozen=True)
class Store:
    """Write `value` to the element of `buffer` at the current loop indices."""

    buffer: str
    value: Expr


@dataclass(frozen=True)
class Loop:
    axes: tuple[str, ...]
    body: tuple[Stmt, ...] = ()
    reductions: tuple[Reduction, ...] = ()


Stmt = Loop | Let | Store


class StmtVisitor:
    """Walks a statement list in order for a backend's emitter: `on_loop` and `on_store` per
    statement, and a `Let` binds its name to `self.expr(value)` in `self.env`."""

    env: dict
    expr: Callable[[Expr], object]

    def stmts(self, stmts: tuple[Stmt, ...]) -> None:
        for stmt in stmts:
            if isinstance(stmt, Loop):
                self.on_loop(stmt)
            elif isinstance(stmt, Let):
                self.env[stmt.name] = self.expr(stmt.value)
            else:
                self.on_store(stmt)

    def on_loop(self, loop: Loop) -> None:
        raise NotImplementedError

    def on_store(self, store: Store) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Kernel:
    name: str
    axes: tuple[Axis, ...]
    buffers: tuple[Buffer, ...]
    body: tuple[Stmt, ...]

    def axis(self, name: str) -> Axis:
        return next(a for a in self.axes if a.name == name)

    def axis_index(self, name: str) -> int:
        return [a.name for a in self.axes].index(name)

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    def stride(self, buffer: str, axis: str) -> int | None:
        return self.buffer(buffer).strides[self.axis_index(axis)]

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if not b.output and not b.scratch)

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.output)

    def loops(self) -> Iterator[Loop]:
        """Every loop, outermost first."""
        stack = list(reversed(self.body))
        while stack:
            stmt = stack.pop()
            if isinstance(stmt, Loop):
                yield stmt
                stack.extend(reversed(stmt.body))


def param_layout(kernel: Kernel) -> tuple[tuple[str, ...], ...]:
    """What a compiled kernel's int64 `params` array holds, in order: ("size", axis) for run-time
    sizes, ("stride", buffer, axis), and
    ("slice", buffer): the elements of a scratch buffer each thread has."""
    sizes = [("size", a.name) for a in kernel.axes if a.size is None]
    strides = [
        ("stride", b.name, a.name)
        for b in kernel.buffers
        for a, s in zip(kernel.axes, b.strides, strict=True)
        if s is None
    ]
    slices = [("slice", b.name) for b in kernel.buffers if b.scratch]
    return tuple(sizes + strides + slices)


def map_expr(expr: Expr, replace: Callable[[Expr], Expr | None]) -> Expr:
    """`expr` rebuilt top-down: where `replace(e)` gives an expression it stands for `e`'s whole
    subtree, else `e` keeps its op over rebuilt operands. Shared subtrees are rebuilt once and
    stay shared."""
    done: dict[int, Expr] = {}

    def rebuild(e: Expr) -> Expr:
        if id(e) not in done:
            new = replace(e)
            if new is None:
                new = Call(e.op, tuple(rebuild(a) for a in e.args)) if isinstance(e, Call) else e
            done[id(e)] = new
        return done[id(e)]

    return rebuild(expr)


def walk_expr(expr: Expr) -> Iterator[Expr]:
    """`expr` and its distinct subexpressions, operands first, each once (a shared subtree is
    not walked again: along every path it would be exponential in the depth)."""
    seen: set[int] = set()

    def walk(e: Expr) -> Iterator[Expr]:
        if id(e) in seen:
            return
        seen.add(id(e))
        if isinstance(e, Call):
            for arg in e.args:
                yield from walk(arg)
        yield e

    return walk(expr)


def verify_kernel(kernel: Kernel) -> Kernel:
    """Check names, strides and scoping: a buffer that varies along an axis is only touched
    inside a loop over it, and every Ref is bound before use."""
    axes = {a.name for a in kernel.axes}
    if len(axes) != len(kernel.axes):
        raise TilefoldError(f"kernel @{kernel.name}: duplicate axis names")
    for buf in kernel.buffers:
        if len(buf.strides) != len(kernel.axes) or buf.dtype not in DTYPES or (
                buf.scratch and buf.output):
            raise TilefoldError(f"kernel @{kernel.name}: bad buffer {buf}")

    def check_expr(expr: Expr, scope: set[str], names: set[str], where: str) -> None:
        for e in walk_expr(expr):
            if isinstance(e, Ref) and e.name not in names:
                raise TilefoldError(f"kernel @{kernel.name}: {where} uses unbound {e.name}")
            if isinstance(e, Dim) and e.axis not in axes:
                raise TilefoldError(f"kernel @{kernel.name}: unknown axis {e.axis}")
            if isinstance(e, Load):
                check_access(e.buffer, scope, where)

    def check_access(name: str, scope: set[str], where: str) -> None:
        buf = kernel.buffer(name)
        for axis, stride in zip(kernel.axes, buf.strides, strict=True):
            if stride != 0 and axis.size != 1 and axis.name not in scope:
                raise TilefoldError(
                    f"kernel @{kernel.name}: {where} touches {name}, which varies along "
                    f"{axis.name}, outside a loop over {axis.name}"
                )

    def check(stmts: tuple[Stmt, ...], scope: set[str], names: set[str]) -> None:
        for stmt in stmts:
            if isinstance(stmt, Loop):
                if set(stmt.axes) & scope or not set(stmt.axes) <= axes:
                    raise TilefoldError(f"kernel @{kernel.name}: bad loop axes {stmt.axes}")
                inner, inner_names = scope | set(stmt.axes), set(names)
                check(stmt.body, inner, inner_names)
                for red in stmt.reductions:
                    check_expr(red.value, inner, inner_names, f"reduction {red.name}")
                names |= {r.name for r in stmt.reductions}
            elif isinstance(stmt, Let):
                check_expr(stmt.value, scope, names, f"let {stmt.name}")
                names.add(stmt.name)
            else:
                written = kernel.buffer(stmt.buffer)
                if not written.output and not written.scratch:
                    raise TilefoldError(f"kernel @{kernel.name}: store to input {stmt.buffer}")
                check_access(stmt.buffer, scope, f"store to {stmt.buffer}")
                check_expr(stmt.value, scope, names, f"store to {stmt.buffer}")

    check(kernel.body, set(), set())
    return kernel
