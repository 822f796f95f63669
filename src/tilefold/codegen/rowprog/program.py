"""Row programs: elementwise ops and last-axis reductions over the rows of an [R, N] space.

The generated-epilogue engine of the building-blocks method (bias, activation, residual,
scaling, softmax/layer_norm rows of a GEMM's C). Ops are lowered by the op-lowering table
(`codegen/lower/rules.py`) to primitives over numbered values; `emit.py` runs a primitive that
needs a row reduction's result in a later pass (stage) over the row.

Whether an operand is a full tile, a row shared by all rows or one value per row follows from
how the ops line its dims up with C's (`Space`, over `tilefold.ir.axes`), never from its shape:
an [N] bias and an [M] row sum look alike when M == N.

Values are f32 lanes (bf16/f16 results rounded after each op, bools as 0/1) or i32 lanes
(integer arithmetic, wrapping as the reference's); arguments are f32, bf16, f16, i32 or bool
(a mask, as 0/1 lanes) in memory, and an input may be stored wider than its IR type (a bf16
GEMM's f32 sums, rounded to bf16 when loaded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tilefold.codegen.lower import lower_op
from tilefold.codegen.lower.rules import ROUNDED
from tilefold.errors import UnsupportedError
from tilefold.ir import Operation, Value
from tilefold.ir.axes import AxisClasses, Pair
from tilefold.ir.types import TensorType

# Dtypes a value inside the program may have, held in f32 lanes: rounded values, 0/1 masks.
INTERNAL = {"f32", "f16", "bf16", "bool", "i32"}
MEMORY = {"f32", "f16", "bf16", "i32", "bool"}  # element types of the arguments
INT_ARITH = {"add", "sub", "mul", "max", "min", "relu", "neg", "abs"}  # i32 in, i32 out
INT_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}  # i32 in, 0/1 in f32 out
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
    """Primitives over numbered values; `sources[i]` says how input value i is loaded,
    `memory[arg]` what element type argument `arg` holds, `ints` the values in i32 lanes
    ("itof" converts one to f32)."""

    rows: int = field(repr=False)  # not in the repr (a kernel's fingerprint): run-time rows
    n: int
    prims: dict[int, Prim] = field(default_factory=dict)
    sources: dict[int, Source] = field(default_factory=dict)
    vec: dict[int, bool] = field(default_factory=dict)
    outputs: list[tuple[int, int]] = field(default_factory=list)  # (value, arg index)
    memory: dict[int, str] = field(default_factory=dict)
    ints: set[int] = field(default_factory=set)
    count: int = 0
    made: dict[tuple, int] = field(default_factory=dict, repr=False)  # prims are pure: one each

    def new(self, vec: bool, integer: bool = False) -> int:
        self.count += 1
        self.vec[self.count] = vec
        if integer:
            self.ints.add(self.count)
        return self.count

    def prim(self, op: str, *args: int, const: float = 0.0) -> int:
        """The value of `op` on `args`, computed once however often a rule asks for it
        (softmax's exp(x - max) feeds both its sum and its result)."""
        key = (op, args, const)
        if key not in self.made:
            vec = op not in IDENTITY and any(self.vec[a] for a in args)
            self.made[key] = out = self.new(vec, self._integer(op, args))
            self.prims[out] = Prim(op, args, const)
        return self.made[key]

    def constant(self, value: float) -> int:
        return self.prim("const", const=value)

    def _integer(self, op: str, args: tuple[int, ...]) -> bool:
        """Whether `op` on `args` gives i32 lanes; refuses what i32 lanes cannot compute."""
        ints = [a in self.ints for a in args]
        if not any(ints):
            return False
        if not all(ints):
            raise NotARowProgram(f"'{op}' mixes i32 and float values")
        if op not in INT_ARITH | INT_COMPARE | {"itof"}:
            raise NotARowProgram(f"'{op}' of i32 values is not in row programs (i32 lanes do "
                                 f"{', '.join(sorted(INT_ARITH | INT_COMPARE))} and casts to "
                                 "float)")
        return op in INT_ARITH


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
                  space: Value, stored: Mapping[Value, str] | None = None,
                  io: frozenset[str] | set[str] = MEMORY) -> Program:
    """Lower `ops` (reading `inputs`, writing `outputs`; `types` are every value's concrete
    types, `constants` the inputs bound to constants) to a row program over the rows of
    `space`'s shape. Arguments hold their IR dtype, except inputs `stored` names: f32 memory
    for a bf16/f16 value (a low-precision GEMM's sums), rounded when loaded; `io` are the
    memory dtypes the caller's loads and stores convert (all of MEMORY for the CPU's)."""
    rows = Space(types, ops, space)
    prog = Program(math.prod(rows.domain[:-1]), rows.domain[-1])
    cx = _RowContext(prog, rows, constants)
    ids: dict[Value, int] = {}
    for index, v in enumerate(inputs):
        dtype = str(types[v].dtype)
        prog.memory[index] = memory = (stored or {}).get(v, dtype)
        _check_dtype(v, memory, io, "in memory")
        if memory != dtype and not (memory == "f32" and dtype in ROUNDED):
            raise NotARowProgram(f"%{v.name} is {dtype}, stored as {memory}: only bf16/f16 "
                                 "values may be stored as f32")
        source = rows.source(v, index)
        ids[v] = prog.new(source.vec, memory == "i32")
        prog.sources[ids[v]] = source
        if memory != dtype:
            ids[v] = prog.prim(f"round_{dtype}", ids[v])
    for op in ops:
        result = str(types[op.results[0]].dtype)
        _check_dtype(op.results[0], result, INTERNAL, "inside")
        missing = [v for v in op.operands if v not in ids]
        if missing:
            raise NotARowProgram(f"%{missing[0].name} is not an input of the row program")
        args = [ids[v] for v in op.operands]
        if op.name == "cast" and result != "i32":
            args = [prog.prim("itof", a) if a in prog.ints else a for a in args]
        try:
            ids[op.results[0]] = out = lower_op(cx, op, args)
        except UnsupportedError as exc:
            raise NotARowProgram(exc.message) from None
        if (out in prog.ints) != (result == "i32"):
            source = str(types[op.operands[0]].dtype)
            raise NotARowProgram(f"'{op.name}' from {source} to {result} is not in row programs "
                                 "(i32 values come from i32 inputs and convert only to floats)")
    for index, v in enumerate(outputs, start=len(inputs)):
        prog.memory[index] = str(types[v].dtype)
        _check_dtype(v, prog.memory[index], io, "in memory")
        vec, picked = rows.varies(v)
        if vec != prog.vec[ids[v]] or picked != rows.live:  # each row writes its own part
            raise NotARowProgram(f"output %{v.name} {list(rows.shape(v))} is not a row value")
        prog.outputs.append((ids[v], index))
    return prog


def _check_dtype(v: Value, dtype: str, allowed: set[str], where: str) -> None:
    if dtype not in allowed:
        raise NotARowProgram(f"%{v.name} is {dtype}; {where} a row program values are "
                             f"{'/'.join(sorted(allowed))}")
