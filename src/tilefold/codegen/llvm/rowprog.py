"""Emits a row program (`program.py`) as LLVM IR: per row, one vectorized loop with a masked
tail per stage; vector values crossing stages are kept in a per-thread row buffer, so C is
read once from cache per stage. Arguments are loaded and stored in their element types
(`codegen/llvm/memory.py`: bf16 stores round to nearest even).
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm import memory
from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.memory import round_to
from tilefold.codegen.llvm.vecmath import MATH_FUNCTIONS, MathBuilder
from tilefold.codegen.rowprog.program import IDENTITY, NotARowProgram, Prim, Program, Source

ARITH = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}
# Comparisons give 1.0 or 0.0 (NaN compares false, except for ne), as the kernel IR's do.
COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
LLVM_MATH = {"sin": "sin", "cos": "cos", "floor": "floor", "pow": "pow"}  # LLVM intrinsics
INT_ARITH = {"add": "add", "sub": "sub", "mul": "mul"}  # i32 lanes wrap, as the reference
MAX_ROW_BUFFERS = 4


def _offset(b: ir.IRBuilder, src: Source, row: ir.Value) -> ir.Value:
    """The element offset of row `row`'s part of `src`."""
    if src.stride == 0:
        return u.const(0)
    if src.div != 1:
        row = b.udiv(row, u.const(src.div))
    if src.mod:
        row = b.urem(row, u.const(src.mod))
    return b.mul(row, u.const(src.stride))


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
        ptrs = [b.bitcast(p, memory.MEMORY_TYPES[self.p.memory[arg]].as_pointer())
                for arg, p in enumerate(ptrs)]
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
                dtype = self.p.memory[arg]
                memory.store_scalar(b, _from_lanes(b, scalars[value], dtype),
                                    u.gep(b, ptrs[arg], row), dtype)

    def _scalars(self, b, ptrs, row, stage, scalars) -> None:
        """Scalar (per-row) values that become computable at the start of `stage`."""
        m = MathBuilder(b, u.f32)
        for i in sorted(self.p.vec):
            if self.p.vec[i] or i in scalars or self.stage[i] > stage:
                continue
            if i in self.p.sources:
                src = self.p.sources[i]
                dtype = self.p.memory[src.arg]
                scalars[i] = _to_lanes(b, memory.load_scalar(
                    b, u.gep(b, ptrs[src.arg], _offset(b, src, row)), dtype), dtype)
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
                values[i] = self._load(b, ptrs[src.arg], b.add(_offset(b, src, row), j), mask,
                                       self.p.memory[src.arg])
            elif self.stage[i] < stage:
                values[i] = self._load(b, buffers[i], j, mask)
            else:
                prim = self.p.prims[i]
                values[i] = self._op(m, prim, [get(a) for a in prim.args])
            return values[i]

        for i in sorted(self.p.prims):
            if self.p.vec[i] and self.stage[i] == stage:
                get(i)
                if i in buffers:  # never an i32 value: those do not depend on reductions
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
                self._store(b, get(value), ptrs[arg], offset, mask, self.p.memory[arg])
        return out

    def _load(self, b, base, offset, mask, dtype: str = "f32"):
        raw = memory.load_vector(b, u.gep(b, base, offset), dtype, self.lanes, mask)
        return _to_lanes(b, raw, dtype)

    def _store(self, b, value, base, offset, mask, dtype: str = "f32"):
        memory.store_vector(b, _from_lanes(b, value, dtype), u.gep(b, base, offset), dtype, mask)

    @staticmethod
    def _op(m: MathBuilder, prim: Prim, args: list[ir.Value]) -> ir.Value:
        """One primitive (`codegen/lower/primitives.py`) on f32 lanes, booleans as 0.0/1.0, or
        on i32 lanes (`program.INT_ARITH`, `INT_COMPARE`, "itof")."""
        b = m.b
        op = prim.op
        if args and _is_int(args[0].type):
            return _int_op(b, op, args)
        if op == "const":
            return m.c(prim.const)
        if op in ARITH:
            return getattr(b, ARITH[op])(*args)
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
        if op in ("and", "or"):
            x, y = (b.fcmp_unordered("!=", a, m.c(0.0)) for a in args)
            return b.uitofp((b.and_ if op == "and" else b.or_)(x, y), args[0].type)
        if op == "select":
            return b.select(b.fcmp_unordered("!=", args[0], m.c(0.0)), args[1], args[2])
        if op in ("round_f16", "round_bf16"):
            return round_to(b, args[0], op.removeprefix("round_"))
        if op in LLVM_MATH:
            return m._call(LLVM_MATH[op], *args)
        return MATH_FUNCTIONS[op](m, args[0])

    def row_buffers(self, b: ir.IRBuilder) -> dict[int, ir.Value]:
        """Per-thread row buffers for values that cross a reduction (allocated once)."""
        return {i: b.bitcast(b.alloca(ir.ArrayType(u.f32, self.p.n), name=f"row{i}"), u.f32
                             .as_pointer()) for i in self.kept}


def _is_int(ty: ir.Type) -> bool:
    return isinstance(ty.element if isinstance(ty, ir.VectorType) else ty, ir.IntType)


def _float_like(ty: ir.Type) -> ir.Type:
    return u.vec(u.f32, ty.count) if isinstance(ty, ir.VectorType) else u.f32


def _int_op(b: ir.IRBuilder, op: str, args: list[ir.Value]) -> ir.Value:
    """A primitive on i32 lanes: arithmetic wraps, comparisons give 0.0/1.0 in f32."""
    x = args[0]
    zero = ir.Constant(x.type, [0] * x.type.count if isinstance(x.type, ir.VectorType) else 0)
    if op in INT_ARITH:
        return getattr(b, INT_ARITH[op])(*args)
    if op in ("max", "min"):
        return b.select(b.icmp_signed(">" if op == "max" else "<", *args), *args)
    if op == "relu":
        return b.select(b.icmp_signed(">", x, zero), x, zero)
    if op == "neg":
        return b.sub(zero, x)
    if op == "abs":  # the most negative value wraps to itself, as the reference's
        return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
    if op in COMPARE:
        return b.uitofp(b.icmp_signed(COMPARE[op], *args), _float_like(x.type))
    if op == "itof":
        return b.sitofp(x, _float_like(x.type))
    raise NotARowProgram(f"'{op}' of i32 values is not in row programs")


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


def _to_lanes(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    """A loaded element in the program's lanes: a bool (i1) as 0.0/1.0, the rest as loaded."""
    return b.uitofp(value, _like(value.type, u.f32)) if dtype == "bool" else value


def _from_lanes(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    """A lane value in the form `memory` stores for `dtype`: a bool from 0.0/1.0 as i1."""
    if dtype != "bool":
        return value
    return b.fcmp_unordered("une", value, ir.Constant(value.type, 0.0 if not isinstance(
        value.type, ir.VectorType) else [0.0] * value.type.count))


def _like(ty: ir.Type, element: ir.Type) -> ir.Type:
    return u.vec(element, ty.count) if isinstance(ty, ir.VectorType) else element

