"""Row programs: elementwise ops and last-axis reductions over the rows of an [R, N] space.

The generated-epilogue engine of the building-blocks method (bias, activation, residual,
scaling, softmax/layer_norm rows of a GEMM's C). Ops are lowered to primitives; a primitive
that needs a row reduction's result runs in a later pass (stage) over the row, and vector
values crossing stages are kept in a per-thread row buffer. Each stage is one vectorized loop
with a masked tail, so C is read once from cache per stage.

Whether an operand is a full tile, a row shared by all rows or one value per row follows from
how the ops line its dims up with C's (`Space`, over `tilefold.ir.axes`), never from its shape:
an [N] bias and an [M] row sum look alike when M == N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.codegen.kernel.memory import round_to
from tilefold.codegen.vecmath import MATH_FUNCTIONS, MathBuilder
from tilefold.errors import UnsupportedError
from tilefold.ir import Operation, Value
from tilefold.ir.axes import NORMALIZING, AxisClasses
from tilefold.strategy.problem import Problem

BINARY = {"add", "sub", "mul", "div", "max", "min"}
# Comparisons give 1.0 or 0.0 (NaN compares false, except for ne), as the kernel IR's do.
COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# Dtypes a value inside the program may have, held in f32 lanes: rounded values, 0/1 masks.
INTERNAL = {"f32", "f16", "bf16", "bool"}
UNARY = {"neg", "abs", "relu", "sqrt", "reciprocal", *MATH_FUNCTIONS}
REDUCE = {"reduce_sum": "rsum", "reduce_max": "rmax", "reduce_min": "rmin", "reduce_mean": "rsum"}
IDENTITY = {"rsum": 0.0, "rmax": -math.inf, "rmin": math.inf}
MAX_ROW_BUFFERS = 4


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

    def offset(self, b: ir.IRBuilder, row: ir.Value) -> ir.Value:
        if self.stride == 0:
            return u.const(0)
        if self.div != 1:
            row = b.udiv(row, u.const(self.div))
        if self.mod:
            row = b.urem(row, u.const(self.mod))
        return b.mul(row, u.const(self.stride))


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

    def new(self, vec: bool) -> int:
        self.count += 1
        self.vec[self.count] = vec
        return self.count

    def prim(self, op: str, *args: int, const: float = 0.0) -> int:
        vec = op not in IDENTITY and any(self.vec[a] for a in args)
        out = self.new(vec)
        self.prims[out] = Prim(op, args, const)
        return out

    def constant(self, value: float) -> int:
        return self.prim("const", const=value)


class Space:
    """The rows of `space`'s shape (a GEMM's C) and, from how `ops` line dims up, which of its
    axes each value's dims index: a value's role (a full tile, one row shared by all rows, one
    value per row, ...) comes from that, not from comparing its shape with C's."""

    def __init__(self, problem: Problem, ops: list[Operation], space: Value):
        self.problem = problem
        rank = len(problem.shape(space))
        self.domain = problem.shape(space) or (1,)  # 0-d (a dot product): one row of one value
        self.last = len(self.domain) - 1
        self.live = [i for i in range(self.last) if self.domain[i] > 1]  # the others index 0
        self.classes = AxisClasses()
        for op in ops:
            try:
                self.classes.align(op)
            except UnsupportedError as exc:
                raise NotARowProgram(exc.message) from None
        self.axis_of = {self.classes.find((space, j)): j for j in range(rank)}
        if len(self.axis_of) < rank:
            raise NotARowProgram(
                f"the ops line two axes of %{space.name} {list(self.domain)} up with each other "
                "(NumPy aligns a keepdims=false row result with the last axis, not the rows: "
                "keep the reduced dim)")

    def axis(self, v: Value, dim: int) -> int | None:
        """The axis of the space that `dim` of `v` indexes (None: it broadcasts)."""
        return self.axis_of.get(self.classes.find((v, dim)))

    def varies(self, v: Value) -> tuple[bool, list[int]]:
        """Whether `v` varies along the row, and the row axes (of size > 1) it varies along."""
        shape, domain = self.problem.shape(v), self.domain
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
            raise NotARowProgram(f"%{v.name} {list(self.problem.shape(v))} varies along axes "
                                 f"{picked} of the space {list(domain)}, which are not neighbours")
        stride = domain[-1] if vec else 1
        if picked == live:
            return Source(arg, stride, vec)
        after = live[live.index(picked[-1]) + 1:]
        return Source(arg, stride, vec, math.prod(domain[i] for i in after),
                      math.prod(domain[i] for i in picked))

    def reduces_rows(self, x: Value, dims: list[int]) -> bool:
        """Whether `dims` of `x` are exactly the one dim along the rows of the space."""
        return [self.axis(x, j) for j in dims] == [self.last]


def build_program(problem: Problem, ops: list[Operation], inputs: list[Value],
                  outputs: list[Value], space: Value) -> Program:
    """Lower `ops` (reading `inputs`, writing `outputs`) to a row program over the rows of
    `space`'s shape."""
    rows = Space(problem, ops, space)
    prog = Program(math.prod(rows.domain[:-1]), rows.domain[-1])
    ids: dict[Value, int] = {}
    for index, v in enumerate(inputs):
        _check_dtype(problem, v, {"f32"})
        source = rows.source(v, index)
        ids[v] = prog.new(source.vec)
        prog.sources[ids[v]] = source
    for op in ops:
        _check_dtype(problem, op.results[0], INTERNAL)
        missing = [v for v in op.operands if v not in ids]
        if missing:
            raise NotARowProgram(f"%{missing[0].name} is not an input of the row program")
        ids[op.results[0]] = _lower(prog, op, [ids[v] for v in op.operands], problem, rows)
    for index, v in enumerate(outputs, start=len(inputs)):
        _check_dtype(problem, v, {"f32"})
        vec, picked = rows.varies(v)
        if vec != prog.vec[ids[v]] or picked != rows.live:  # each row writes its own part
            raise NotARowProgram(f"output %{v.name} {list(problem.shape(v))} is not a row value")
        prog.outputs.append((ids[v], index))
    return prog


def _check_dtype(problem: Problem, v: Value, allowed: set[str]) -> None:
    if str(problem.types[v].dtype) not in allowed:
        where = "inside" if len(allowed) > 1 else "in and out of"
        raise NotARowProgram(f"%{v.name} is {problem.types[v].dtype}; {where} a row program "
                             f"values are {'/'.join(sorted(allowed))}")


def _lower(prog: Program, op: Operation, args: list[int], problem: Problem, rows: Space) -> int:
    name = op.name
    n = rows.domain[-1]
    inv_n = 1.0 / n if n else math.nan  # the mean of an empty row is NaN, as in NumPy
    if name in BINARY:
        return prog.prim(name, *args)
    if name == "gelu":
        return prog.prim("gelu_tanh" if op.attr("approximate") == "tanh" else "gelu", *args)
    if name in UNARY:
        return prog.prim(name, *args)
    if name in COMPARE:
        return prog.prim(name, *args)
    if name == "where":
        return prog.prim("select", *args)
    if name == "cast":
        return _cast(prog, str(problem.types[op.operands[0]].dtype), str(op.attr("dtype")),
                     args[0])
    if name == "pow":
        return _pow(prog, op, args, problem)
    x = op.operands[0]
    rank = len(problem.shape(x))
    if name in REDUCE:
        axes = list(range(rank)) if op.attr("axes") is None else [a % rank for a in op.attr("axes")]
        if not rows.reduces_rows(x, sorted(axes)):
            raise NotARowProgram(f"{name} over axes {axes} does not reduce the rows")
        out = prog.prim(REDUCE[name], args[0])
        return prog.prim("mul", out, prog.constant(inv_n)) if name == "reduce_mean" else out
    first = op.attr("axis") % rank if name in NORMALIZING else None
    if name in ("softmax", "log_softmax") and rows.reduces_rows(x, [first]):
        (x,) = args
        shifted = prog.prim("sub", x, prog.prim("rmax", x))
        e = prog.prim("exp", shifted)
        total = prog.prim("rsum", e)
        if name == "softmax":
            return prog.prim("div", e, total)
        return prog.prim("sub", shifted, prog.prim("log", total))
    if name in ("layer_norm", "rms_norm") and rows.reduces_rows(x, list(range(first, rank))):
        x, w, *bias = args
        eps = prog.constant(op.attr("eps"))
        if name == "layer_norm":
            x = prog.prim("sub", x, prog.prim("mul", prog.prim("rsum", x), prog.constant(inv_n)))
        var = prog.prim("mul", prog.prim("rsum", prog.prim("mul", x, x)), prog.constant(inv_n))
        y = prog.prim("mul", prog.prim("mul", x, prog.prim("rsqrt", prog.prim("add", var, eps))),
                      w)
        return prog.prim("add", y, bias[0]) if bias else y
    raise NotARowProgram(f"'{name}' has no row-program lowering over these axes")


def _cast(prog: Program, src: str, dst: str, x: int) -> int:
    """A cast between internal dtypes: f32 lanes hold every one of them exactly."""
    if dst == "bool":
        return x if src == "bool" else prog.prim("ne", x, prog.constant(0.0))
    if dst in ("f16", "bf16") and src not in (dst, "bool"):  # 0 and 1 are exact in both
        return prog.prim(f"round_{dst}", x)
    return x  # to f32, or to the dtype x already has


def _pow(prog: Program, op: Operation, args: list[int], problem: Problem) -> int:
    """x ** c for a constant scalar c in {1, 2, 3, 4, 0.5} (tanh-GELU's x ** 3): products or
    a square root, exact where the reference's power is."""
    c = problem.constants.get(op.operands[1])
    if c is None or c.size != 1 or float(c.reshape(-1)[0]) not in (1.0, 2.0, 3.0, 4.0, 0.5):
        raise NotARowProgram("pow needs a constant exponent of 1, 2, 3, 4 or 0.5")
    x, e = args[0], float(c.reshape(-1)[0])
    if e == 0.5:
        return prog.prim("sqrt", x)
    square = prog.prim("mul", x, x)
    return {1.0: x, 2.0: square, 3.0: prog.prim("mul", square, x),
            4.0: prog.prim("mul", square, square)}[e]


class Emitter:
    """Emits a `Program` as the per-row body of a row kernel (see `native.emit_row_kernel`)."""

    def __init__(self, prog: Program, lanes: int, features: frozenset[str] = frozenset()):
        self.p = prog
        self.lanes = lanes
        self.features = features  # the target's: ISA-specific math forms (vscalefps)
        self.stage: dict[int, int] = {}
        for i in sorted(prog.vec):
            prim = prog.prims.get(i)
            deps = [self.stage[a] for a in prim.args] if prim else []
            self.stage[i] = max(deps, default=0) + (1 if prim and prim.op in IDENTITY else 0)
        self.stages = max(self.stage.values(), default=0) + 1
        self.kept = sorted(
            i for i in prog.prims if prog.vec[i]
            and any(self._use_stage(j) > self.stage[i] for j, q in prog.prims.items()
                    if i in q.args)
        )
        if len(self.kept) > MAX_ROW_BUFFERS:
            raise NotARowProgram(f"{len(self.kept)} row values cross reductions "
                                 f"(limit {MAX_ROW_BUFFERS})")

    def _use_stage(self, i: int) -> int:
        """The stage whose loop evaluates prim `i` (a reduction finishes one stage later)."""
        return self.stage[i] - (1 if self.p.prims[i].op in IDENTITY else 0)

    def emit(self, b: ir.IRBuilder, ptrs: list[ir.Value], row: ir.Value,
             buffers: dict[int, ir.Value]) -> None:
        scalars: dict[int, ir.Value] = {}
        for stage in range(self.stages):
            self._scalars(b, ptrs, row, stage, scalars)
            reductions = [i for i, q in self.p.prims.items()
                          if q.op in IDENTITY and self.stage[i] == stage + 1]
            vec_ops = [i for i in self.p.prims if self.p.vec[i] and self.stage[i] == stage]
            if not vec_ops and not reductions:
                continue
            self._stage_loops(b, ptrs, row, stage, scalars, buffers, reductions)
        self._scalars(b, ptrs, row, self.stages, scalars)
        for value, arg in self.p.outputs:
            if not self.p.vec[value]:
                b.store(scalars[value], u.gep(b, ptrs[arg], row))

    def _scalars(self, b, ptrs, row, stage, scalars) -> None:
        """Scalar (per-row) values that become computable at the start of `stage`."""
        m = MathBuilder(b, u.f32)
        for i in sorted(self.p.vec):
            if self.p.vec[i] or i in scalars or self.stage[i] > stage:
                continue
            if i in self.p.sources:
                src = self.p.sources[i]
                scalars[i] = b.load(u.gep(b, ptrs[src.arg], src.offset(b, row)))
            elif self.p.prims[i].op not in IDENTITY:
                prim = self.p.prims[i]
                scalars[i] = self._op(m, prim, [scalars[a] for a in prim.args])

    def _stage_loops(self, b, ptrs, row, stage, scalars, buffers, reductions) -> None:
        n, lanes = self.p.n, self.lanes
        vty = u.vec(u.f32, lanes)
        full = n - n % lanes
        inits = [_splat_const(vty, IDENTITY[self.p.prims[r].op]) for r in reductions]
        with u.for_range_carry(b, 0, full, lanes, inits, name=f"s{stage}") as loop:
            phis = dict(zip(reductions, loop.values, strict=True))
            new = self._iteration(b, ptrs, row, loop.index, None, stage, scalars, buffers,
                                  reductions, phis)
            loop.next = [new[r] for r in reductions]
        accs = dict(zip(reductions, loop.result, strict=True))
        if n % lanes:
            mask = u.lane_mask(b, u.const(n % lanes), lanes)
            accs = self._iteration(b, ptrs, row, u.const(full), mask, stage, scalars, buffers,
                                   reductions, accs)
        for r in reductions:
            scalars[r] = _horizontal(b, self.p.prims[r].op, accs[r], lanes)

    def _iteration(self, b, ptrs, row, j, mask, stage, scalars, buffers, reductions, accs):
        m = MathBuilder(b, u.vec(u.f32, self.lanes), self.features)
        values: dict[int, ir.Value] = {}

        def get(i: int) -> ir.Value:
            if i in values:
                return values[i]
            if not self.p.vec[i]:
                values[i] = u.splat(b, scalars[i], self.lanes)
            elif i in self.p.sources:
                src = self.p.sources[i]
                values[i] = self._load(b, ptrs[src.arg], b.add(src.offset(b, row), j), mask)
            elif self.stage[i] < stage:
                values[i] = self._load(b, buffers[i], j, mask)
            else:
                prim = self.p.prims[i]
                values[i] = self._op(m, prim, [get(a) for a in prim.args])
            return values[i]

        for i in sorted(self.p.prims):
            if self.p.vec[i] and self.stage[i] == stage:
                get(i)
                if i in buffers:
                    self._store(b, values[i], buffers[i], j, mask)
        out = dict(accs)
        for r in reductions:
            prim = self.p.prims[r]
            x = get(prim.args[0])
            if mask is not None:
                x = b.select(mask, x, _splat_const(x.type, IDENTITY[prim.op]))
            out[r] = _combine(m, prim.op, accs[r], x)
        for value, arg in self.p.outputs:
            if self.p.vec[value] and self.stage[value] == stage:
                offset = b.add(b.mul(row, u.const(self.p.n)), j)
                self._store(b, get(value), ptrs[arg], offset, mask)
        return out

    def _load(self, b, base, offset, mask):
        ptr = u.vptr(b, u.gep(b, base, offset), self.lanes)
        if mask is None:
            return b.load(ptr, align=4)
        return u.masked_load(b, ptr, mask, self.lanes)

    def _store(self, b, value, base, offset, mask):
        ptr = u.vptr(b, u.gep(b, base, offset), self.lanes)
        if mask is None:
            b.store(value, ptr, align=4)
        else:
            u.masked_store(b, value, ptr, mask)

    @staticmethod
    def _op(m: MathBuilder, prim: Prim, args: list[ir.Value]) -> ir.Value:
        b = m.b
        op = prim.op
        if op == "const":
            return m.c(prim.const)
        if op in ("add", "sub", "mul", "div"):
            return getattr(b, {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}[op])(
                *args)
        if op in ("max", "min"):
            return m._call("maximum" if op == "max" else "minimum", *args)
        if op == "relu":
            return m._call("maximum", args[0], m.c(0.0))
        if op == "neg":
            return b.fneg(args[0])
        if op == "abs":
            return m.abs(args[0])
        if op == "sqrt":
            return m.sqrt(args[0])
        if op == "reciprocal":
            return b.fdiv(m.c(1.0), args[0])
        if op in COMPARE:
            compare = b.fcmp_unordered if op == "ne" else b.fcmp_ordered
            return b.uitofp(compare(COMPARE[op], *args), args[0].type)
        if op == "select":
            return b.select(b.fcmp_unordered("!=", args[0], m.c(0.0)), args[1], args[2])
        if op in ("round_f16", "round_bf16"):
            return round_to(b, args[0], op.removeprefix("round_"))
        return MATH_FUNCTIONS[op](m, args[0])

    def row_buffers(self, b: ir.IRBuilder) -> dict[int, ir.Value]:
        """Per-thread row buffers for values that cross a reduction (allocated once)."""
        return {i: b.bitcast(b.alloca(ir.ArrayType(u.f32, self.p.n), name=f"row{i}"), u.f32
                             .as_pointer()) for i in self.kept}


def _splat_const(ty: ir.VectorType, value: float) -> ir.Constant:
    return ir.Constant(ty, [value] * ty.count)


def _combine(m: MathBuilder, op: str, acc: ir.Value, x: ir.Value) -> ir.Value:
    if op == "rsum":
        return m.b.fadd(acc, x)
    return m._call("maximum" if op == "rmax" else "minimum", acc, x)


def _horizontal(b: ir.IRBuilder, op: str, acc: ir.Value, lanes: int) -> ir.Value:
    vty = acc.type
    if op == "rsum":
        fn = u.intrinsic(b.module, f"llvm.vector.reduce.fadd.v{lanes}f32", u.f32, [u.f32, vty])
        return b.call(fn, [ir.Constant(u.f32, 0.0), acc])
    name = "fmaximum" if op == "rmax" else "fminimum"
    fn = u.intrinsic(b.module, f"llvm.vector.reduce.{name}.v{lanes}f32", u.f32, [vty])
    return b.call(fn, [acc])
