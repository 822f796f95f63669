"""Row programs: elementwise ops and last-axis reductions over the rows of an [R, N] space.

The generated-epilogue engine of the building-blocks method (bias, activation, residual,
scaling, softmax/layer_norm rows of a GEMM's C). Ops are lowered by the op-lowering table
(`codegen/lower/rules.py`) to primitives over numbered values; `emit.py` runs a primitive that
needs a row reduction's result in a later pass (stage) over the row.

Whether an operand is a full tile, a row shared by all rows or one value per row follows from
how the ops line its dims up with C's (`Space`, over `tilefold.ir.axes`), never from its shape:
an [N] bias and an [M] row sum look alike when M == N.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tilefold.codegen.lower import lower_op
from tilefold.errors import UnsupportedError
from tilefold.ir import Operation, Value
from tilefold.ir.axes import AxisClasses, Pair
from tilefold.ir.types import TensorType

# Dtypes a value inside the program may have, held in f32 lanes: rounded values, 0/1 masks.
INTERNAL = {"f32", "f16", "bf16", "bool"}
IDENTITY = {"rsum": 0.0, "rmax": -math.inf, "rmin": math.inf}  # row reductions


class NotARowProgram(Exception):
    """The ops do not fit a row program; the message says why (shown by `explain`)."""


@dataclass
class Prim:
    op: str
    args: tuple[int, ...]
    const: float = 0.0


@dataclass(frozen=True)
class Source:
    """How an input is read for row r: from element ((r // div) % mod) * stride, plus the
    column along the row when `vec` (mod 0: r itself, every row has its own)."""

    arg: int
    stride: int
    vec: bool
    div: int = 1
    mod: int = 0


@dataclass
class Program:
    """Primitives over numbered values; `sources[i]` says how input value i is loaded."""

    rows: int
    n: int
    prims: dict[int, Prim] = field(default_factory=dict)
    sources: dict[int, Source] = field(default_factory=dict)
    vec: dict[int, bool] = field(default_factory=dict)
    outputs: list[tuple[int, int]] = field(default_factory=list)  # (value, arg index)
    count: int = 0
    made: dict[tuple, int] = field(default_factory=dict, repr=False)  # prims are pure: one each

    def new(self, vec: bool) -> int:
        self.count += 1
        self.vec[self.count] = vec
        return self.count

    def prim(self, op: str, *args: int, const: float = 0.0) -> int:
        """The value of `op` on `args`, computed once however often a rule asks for it
        (softmax's exp(x - max) feeds both its sum and its result)."""
        key = (op, args, const)
        if key not in self.made:
            vec = op not in IDENTITY and any(self.vec[a] for a in args)
            self.made[key] = out = self.new(vec)
            self.prims[out] = Prim(op, args, const)
        return self.made[key]

    def constant(self, value: float) -> int:
        return self.prim("const", const=value)


class Space:
    """The rows of `space`'s shape (a GEMM's C) and, from how `ops` line dims up, which of its
    axes each value's dims index: a value's role (a full tile, one row shared by all rows, one
    value per row, ...) comes from that, not from comparing its shape with C's."""

    def __init__(self, types: Mapping[Value, TensorType], ops: list[Operation], space: Value):
        self.types = types
        rank = len(self.shape(space))
        self.domain = self.shape(space) or (1,)  # 0-d (a dot product): one row of one value
        self.last = len(self.domain) - 1
        self.live = [i for i in range(self.last) if self.domain[i] > 1]  # the others index 0
        self.classes = AxisClasses()
        self.reduced: dict[Operation, frozenset[Pair]] = {}
        for op in ops:
            try:
                self.reduced[op] = self.classes.align(op)
            except UnsupportedError as exc:
                raise NotARowProgram(exc.message) from None
        self.axis_of = {self.classes.find((space, j)): j for j in range(rank)}
        if len(self.axis_of) < rank:
            raise NotARowProgram(
                f"the ops line two axes of %{space.name} {list(self.domain)} up with each other "
                "(NumPy aligns a keepdims=false row result with the last axis, not the rows: "
                "keep the reduced dim)")

    def shape(self, v: Value) -> tuple[int, ...]:
        return self.types[v].shape  # type: ignore[return-value]

    def axis(self, v: Value, dim: int) -> int | None:
        """The axis of the space that `dim` of `v` indexes (None: it broadcasts)."""
        return self.axis_of.get(self.classes.find((v, dim)))

    def varies(self, v: Value) -> tuple[bool, list[int]]:
        """Whether `v` varies along the row, and the row axes (of size > 1) it varies along."""
        shape, domain = self.shape(v), self.domain
        axes = []
        for j, size in enumerate(shape):
            axis = self.axis(v, j)
            if size != 1 and axis is None:
                raise NotARowProgram(f"dim {j} of %{v.name} {list(shape)} lines up with no axis "
                                     f"of the space {list(domain)}")
            if size != 1:
                axes.append(axis)
        if axes != sorted(set(axes)):
            raise NotARowProgram(f"%{v.name} {list(shape)} indexes the space {list(domain)} "
                                 "out of order")
        return self.last in axes, [i for i in self.live if i in axes]

    def source(self, v: Value, arg: int) -> Source:
        """How to address `v` (C-contiguous, argument `arg`) at a row and column."""
        vec, picked = self.varies(v)
        if self.live and not picked:
            return Source(arg, 0, vec)
        live, domain = self.live, self.domain
        run = live[live.index(picked[0]):][:len(picked)] if picked else []
        if picked != run:
            raise NotARowProgram(f"%{v.name} {list(self.shape(v))} varies along axes "
                                 f"{picked} of the space {list(domain)}, which are not neighbours")
        stride = domain[-1] if vec else 1
        if picked == live:
            return Source(arg, stride, vec)
        after = live[live.index(picked[-1]) + 1:]
        return Source(arg, stride, vec, math.prod(domain[i] for i in after),
                      math.prod(domain[i] for i in picked))

    def reduces_rows(self, op: Operation) -> bool:
        """Whether `op` reduces exactly the one dim along the rows of the space."""
        return [self.axis(x, j) for x, j in self.reduced[op]] == [self.last]


class _RowContext:
    """The lowering table's context (`codegen/lower/rules.py`) for row programs."""

    def __init__(self, prog: Program, rows: Space, constants: Mapping[Value, np.ndarray]):
        self.prog = prog
        self.rows = rows
        self.constants = constants

    def call(self, prim: str, *xs: int) -> int:
        return self.prog.prim(prim, *xs)

    def const(self, value: float) -> int:
        return self.prog.constant(value)

    def reduce(self, op: Operation, kind: str, x: int) -> int:
        if not self.rows.reduces_rows(op):
            dims = sorted(j for _, j in self.rows.reduced[op])
            raise NotARowProgram(f"'{op.name}' reduces dims {dims} of "
                                 f"{list(self.rows.shape(op.operands[0]))}, not the rows")
        return self.prog.prim("r" + kind, x)

    def inv_count(self, op: Operation) -> int:
        n = self.rows.domain[-1]
        return self.prog.constant(1.0 / n if n else math.nan)  # an empty row's mean is NaN

    def scalar(self, op: Operation, index: int) -> float | None:
        c = self.constants.get(op.operands[index])
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def build_program(types: Mapping[Value, TensorType], constants: Mapping[Value, np.ndarray],
                  ops: list[Operation], inputs: list[Value], outputs: list[Value],
                  space: Value, io: frozenset[str] = frozenset({"f32"})) -> Program:
    """Lower `ops` (reading `inputs`, writing `outputs`; `types` are every value's concrete
    types, `constants` the inputs bound to constants) to a row program over the rows of
    `space`'s shape; `io` are the dtypes the caller's loads and stores convert (f32 only
    for the CPU's row kernels)."""
    rows = Space(types, ops, space)
    prog = Program(math.prod(rows.domain[:-1]), rows.domain[-1])
    cx = _RowContext(prog, rows, constants)
    ids: dict[Value, int] = {}
    for index, v in enumerate(inputs):
        _check_dtype(types, v, io)
        source = rows.source(v, index)
        ids[v] = prog.new(source.vec)
        prog.sources[ids[v]] = source
    for op in ops:
        _check_dtype(types, op.results[0], INTERNAL)
        missing = [v for v in op.operands if v not in ids]
        if missing:
            raise NotARowProgram(f"%{missing[0].name} is not an input of the row program")
        try:
            ids[op.results[0]] = lower_op(cx, op, [ids[v] for v in op.operands])
        except UnsupportedError as exc:
            raise NotARowProgram(exc.message) from None
    for index, v in enumerate(outputs, start=len(inputs)):
        _check_dtype(types, v, io)
        vec, picked = rows.varies(v)
        if vec != prog.vec[ids[v]] or picked != rows.live:  # each row writes its own part
            raise NotARowProgram(f"output %{v.name} {list(rows.shape(v))} is not a row value")
        prog.outputs.append((ids[v], index))
    return prog


def _check_dtype(types: Mapping[Value, TensorType], v: Value, allowed: set[str]) -> None:
    if str(types[v].dtype) not in allowed:
        where = "inside" if len(allowed) > 1 else "in and out of"
        raise NotARowProgram(f"%{v.name} is {types[v].dtype}; {where} a row program "
                             f"values are {'/'.join(sorted(allowed))}")
