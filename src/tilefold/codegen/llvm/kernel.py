"""Kernel IR + Schedule -> LLVM IR: vector loops with masked tails, horizontal and vertical
reductions, inline vecmath, and a parallel entry point over `tilefold_parallel`.

The module exports `void NAME(i8* buf0, ..., i8* bufN, i64* params, i32 nthreads)`; `params`
holds the run-time axis sizes and strides in `param_layout` order. Inside a vector loop a
value is a tuple of `unroll` vectors (one per part) or, when it does not vary along the vector
axis, a scalar that is splat on use; so invariant work stays scalar.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen.kernel import ir as kir
from tilefold.codegen.kernel.ir import param_layout
from tilefold.codegen.kernel.schedule import (
    PREFETCH_ROWS,
    Schedule,
    final_stores,
    prefetching_sweep,
)
from tilefold.codegen.llvm import memory
from tilefold.codegen.llvm.util import for_range, intrinsic, lane_mask, prefetch, splat
from tilefold.codegen.llvm.vecmath import MATH_FUNCTIONS, emit_math, emit_math_parts

LINE_BYTES = 64  # one prefetch per cache line
F32, I1, I8, I32, I64 = ir.FloatType(), ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
I8P = I8.as_pointer()
WORKER = ir.FunctionType(ir.VoidType(), [I8P, I32, I32])
LLVM_UNARY = {"sqrt": "sqrt", "sin": "sin", "cos": "cos", "floor": "floor", "abs": "fabs"}
Val = ir.Value | tuple  # scalar (uniform) or one vector per unrolled part


@dataclass
class _Lanes:
    """The vector loop's current step: its first index, parts, and tail mask (None: full)."""

    base: ir.Value
    parts: int
    mask: ir.Value | None
    count: ir.Value | None  # active lanes in a masked step


class _Emitter(kir.StmtVisitor):
    def __init__(self, kernel: kir.Kernel, schedule: Schedule, fn: ir.Function,
                 features: frozenset[str]):
        self.features = features
        self.k = kernel
        self.s = schedule
        self.streamed = final_stores(kernel) if schedule.streaming_stores else set()
        self.prefetching_loop = prefetching_sweep(kernel, schedule)
        self.prefetching = False
        self.w = schedule.vector_width
        self.fn = fn
        self.entry = fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.index: dict[str, ir.Value] = {}
        self.env: dict[str, Val] = {}
        self.lanes: _Lanes | None = None
        self.memo: dict[kir.Expr, Val] = {}
        self.bounds: dict[str, tuple[ir.Value, ir.Value]] = {}

    # --- set-up -------------------------------------------------------------------------
    def bind(self, ctx: ir.Value, tid: ir.Value, nthreads: ir.Value) -> None:
        b, k = self.b, self.k
        slots = b.bitcast(ctx, I8P.as_pointer())
        self.ptr = {}
        for i, buf in enumerate(k.buffers):
            raw = b.load(b.gep(slots, [ir.Constant(I32, i)]))
            self.ptr[buf.name] = b.bitcast(raw, memory.MEMORY_TYPES[buf.dtype].as_pointer())
        params = b.bitcast(b.load(b.gep(slots, [ir.Constant(I32, len(k.buffers))])),
                           I64.as_pointer())
        loaded = {
            entry: b.load(b.gep(params, [ir.Constant(I32, i)]), name="_".join(entry))
            for i, entry in enumerate(param_layout(k))
        }
        self.size = {
            a.name: ir.Constant(I64, a.size) if a.size is not None else loaded[("size", a.name)]
            for a in k.axes
        }
        self.stride = {
            (buf.name, a.name): ir.Constant(I64, s) if s is not None
            else loaded[("stride", buf.name, a.name)]
            for buf in k.buffers
            for a, s in zip(k.axes, buf.strides, strict=True)
        }
        for buf in k.buffers:  # this thread's slice of a scratch buffer
            if buf.scratch:
                start = b.mul(b.sext(tid, I64), loaded[("slice", buf.name)])
                self.ptr[buf.name] = b.gep(self.ptr[buf.name], [start])
        for a in k.axes:
            self.bounds[a.name] = (ir.Constant(I64, 0), self.size[a.name])
        if self.s.parallel_axis is not None:
            self._split(self.s.parallel_axis, tid, nthreads)

    def _split(self, axis: str, tid: ir.Value, nthreads: ir.Value) -> None:
        """Thread `tid` of `nthreads` takes one contiguous block, vector-step aligned."""
        b = self.b
        size = self.size[axis]
        align = self.w * self.s.unroll if axis == self.s.vector_axis else 1
        n = b.sext(nthreads, I64)
        per = b.sdiv(b.add(size, b.sub(n, ir.Constant(I64, 1))), n)
        per = b.mul(b.sdiv(b.add(per, ir.Constant(I64, align - 1)), ir.Constant(I64, align)),
                    ir.Constant(I64, align))
        lo = b.mul(b.sext(tid, I64), per)
        lo = b.select(b.icmp_signed("<", lo, size), lo, size)
        hi = b.add(lo, per)
        hi = b.select(b.icmp_signed("<", hi, size), hi, size)
        self.bounds[axis] = (lo, hi)

    def alloca(self, ty: ir.Type) -> ir.Value:
        with self.b.goto_block(self.entry):
            self.b.position_at_start(self.entry)
            return self.b.alloca(ty)

    # --- statements ---------------------------------------------------------------------
    def stmts(self, stmts: tuple[kir.Stmt, ...]) -> None:
        """A run of lets and stores computes every value before the first store: an output
        may then share its memory with an input read at the same element (in place)."""
        if stmts and all(isinstance(s, kir.Store | kir.Let) for s in stmts):
            stores = []
            for s in stmts:
                if isinstance(s, kir.Let):
                    self.env[s.name] = self.expr(s.value)
                else:
                    stores.append((s, self.expr(s.value)))
            for s, value in stores:
                self.store(s.buffer, value, id(s) in self.streamed)
            return
        super().stmts(stmts)

    def on_store(self, stmt: kir.Store) -> None:
        self.store(stmt.buffer, self.expr(stmt.value), id(stmt) in self.streamed)

    def on_loop(self, loop: kir.Loop) -> None:
        vector_here = self.s.vector_axis in loop.axes
        parts = self.s.unroll if vector_here else (self.lanes.parts if self.lanes else 0)
        accs = {r.name: self._acc_init(r, parts) for r in loop.reductions}
        outer_memo = self.memo

        def body() -> None:
            self.memo = {}
            self.stmts(loop.body)
            for red in loop.reductions:
                self._accumulate(red, accs[red.name], self.expr(red.value))

        scalar_axes = [a for a in loop.axes if a != self.s.vector_axis]
        enclosing = self.prefetching  # a loop nested in the prefetching sweep keeps on
        self.prefetching = enclosing or loop is self.prefetching_loop
        self._nest(scalar_axes, body if not vector_here else lambda: self._vector_loop(body))
        self.prefetching = enclosing
        self.memo = outer_memo
        for red in loop.reductions:
            ptrs = accs[red.name]
            if vector_here:
                self.env[red.name] = self._horizontal(red.op, [self.b.load(p) for p in ptrs])
            elif parts:
                self.env[red.name] = tuple(self.b.load(p) for p in ptrs)
            else:
                self.env[red.name] = self.b.load(ptrs[0])
        for axis in loop.axes:
            self.index.pop(axis, None)

    def _nest(self, axes: list[str], body) -> None:
        if not axes:
            body()
            return
        lo, hi = self.bounds[axes[0]]
        with for_range(self.b, lo, hi, name=axes[0]) as i:
            self.index[axes[0]] = i
            self._nest(axes[1:], body)

    def _vector_loop(self, body) -> None:
        """Full steps of `unroll` vectors, then masked single vectors up to the end."""
        b, axis, w, u = self.b, self.s.vector_axis, self.w, self.s.unroll
        lo, hi = self.bounds[axis]
        step = ir.Constant(I64, w * u)
        main_end = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), step), step))
        outer = self.lanes
        with for_range(b, lo, main_end, w * u, name=f"{axis}.v") as i:
            self.index[axis] = i
            self.lanes = _Lanes(i, u, None, None)
            body()
        with for_range(b, main_end, hi, w, name=f"{axis}.tail") as i:
            self.index[axis] = i
            count = b.sub(hi, i)
            self.lanes = _Lanes(i, 1, lane_mask(b, count, w), count)
            body()
        self.lanes = outer

    # --- reductions ---------------------------------------------------------------------
    def _acc_init(self, red: kir.Reduction, parts: int) -> list[ir.Value]:
        ty = ir.VectorType(F32, self.w) if parts else F32
        ptrs = [self.alloca(ty) for _ in range(max(parts, 1))]
        for p in ptrs:
            self.b.store(self._const(red.start, ty), p)
        return ptrs

    def _accumulate(self, red: kir.Reduction, ptrs: list[ir.Value], value: Val) -> None:
        b = self.b
        if self.lanes is None:
            b.store(self._combine(red.op, b.load(ptrs[0]), value), ptrs[0])
            return
        for part, ptr in zip(self._parts(value), ptrs, strict=False):  # tails use part 0
            if self.lanes.mask is not None:
                ident = self._const(red.start, part.type)
                part = b.select(self.lanes.mask, part, ident)
            b.store(self._combine(red.op, b.load(ptr), part), ptr)

    def _combine(self, op: str, acc: ir.Value, x: ir.Value) -> ir.Value:
        if op == "sum":
            return self.b.fadd(acc, x)
        return self._minmax(op, x, acc)

    def _minmax(self, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
        """max/min that propagate NaN from either side (as NumPy), without llvm.maximum."""
        b = self.b
        pick_x = b.or_(b.fcmp_ordered(">" if op == "max" else "<", x, y),
                       b.fcmp_unordered("uno", x, x))
        return b.select(pick_x, x, y)

    def _horizontal(self, op: str, parts: list[ir.Value]) -> ir.Value:
        b = self.b
        while len(parts) > 1:
            pairs = zip(parts[0::2], parts[1::2], strict=False)
            parts = [self._combine(op, x, y) for x, y in pairs] + parts[len(parts) // 2 * 2:]
        v = parts[0]
        n = self.w
        while n > 1:
            n //= 2
            lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
            hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n),
                                                    list(range(n, 2 * n))))
            v = self._combine(op, lo, hi)
        return b.extract_element(v, ir.Constant(I32, 0))

    # --- memory -------------------------------------------------------------------------
    def _offset(self, buffer: str, skip_vector: bool) -> ir.Value:
        b = self.b
        total = ir.Constant(I64, 0)
        for axis, idx in self.index.items():
            if skip_vector and axis == self.s.vector_axis:
                continue
            stride = self.stride[(buffer, axis)]
            if isinstance(stride, ir.Constant) and stride.constant == 0:
                continue
            total = b.add(total, b.mul(idx, stride))
        return total

    def _vector_stride(self, buffer: str) -> int | None:
        """The buffer's stride along the vector axis inside a vector loop (None: other)."""
        stride = self.stride[(buffer, self.s.vector_axis)]
        return stride.constant if isinstance(stride, ir.Constant) else None

    def load(self, buffer: str) -> Val:
        b, dtype = self.b, self.k.buffer(buffer).dtype
        base = self.ptr[buffer]
        if self.lanes is None or self._vector_stride(buffer) == 0:
            ptr = b.gep(base, [self._offset(buffer, skip_vector=self.lanes is not None)])
            return memory.load_scalar(b, ptr, dtype)
        offset = self._offset(buffer, skip_vector=False)
        if self._vector_stride(buffer) == 1:
            if self.prefetching and self.lanes.mask is None:
                self._prefetch_ahead(buffer, offset, dtype)
            return tuple(
                memory.load_vector(b, b.gep(base, [b.add(offset, ir.Constant(I64, k * self.w))]),
                                   dtype, self.w, self.lanes.mask)
                for k in range(self.lanes.parts)
            )
        return tuple(self._gather(buffer, offset, k) for k in range(self.lanes.parts))

    def _prefetch_ahead(self, buffer: str, offset: ir.Value, dtype: str) -> None:
        """Prefetch what this full vector step loads, `PREFETCH_ROWS` steps further along the
        prefetch axis: one prefetch per cache line (a prefetch never faults, even past the
        end)."""
        stride = self.stride[(buffer, self.s.prefetch_axis)]
        if isinstance(stride, ir.Constant) and stride.constant == 0:
            return  # the same row for every step (a weight): already in cache
        b = self.b
        ahead = b.add(offset, b.mul(stride, ir.Constant(I64, PREFETCH_ROWS)))
        step_elements = self.w * self.lanes.parts
        per_line = max(LINE_BYTES // memory.element_size(dtype), 1)
        for k in range(0, step_elements, per_line):
            ptr = b.gep(self.ptr[buffer], [b.add(ahead, ir.Constant(I64, k))])
            prefetch(b, ptr)

    def _lane_offsets(self, buffer: str, offset: ir.Value, part: int) -> list[ir.Value]:
        """Per-lane element offsets; masked-off lanes repeat lane 0 (always in bounds)."""
        b = self.b
        stride = self.stride[(buffer, self.s.vector_axis)]
        out = []
        for lane in range(self.w):
            lane_off = ir.Constant(I64, part * self.w + lane)
            if self.lanes.count is not None:
                active = b.icmp_signed("<", lane_off, self.lanes.count)
                lane_off = b.select(active, lane_off, ir.Constant(I64, 0))
            out.append(b.add(offset, b.mul(lane_off, stride)))
        return out

    def _gather(self, buffer: str, offset: ir.Value, part: int) -> ir.Value:
        b, dtype = self.b, self.k.buffer(buffer).dtype
        vty = ir.VectorType(I1 if dtype == "bool" else F32, self.w)
        v = ir.Constant(vty, None)
        for lane, off in enumerate(self._lane_offsets(buffer, offset, part)):
            x = memory.load_scalar(b, b.gep(self.ptr[buffer], [off]), dtype)
            v = b.insert_element(v, x, ir.Constant(I32, lane))
        return v

    def store(self, buffer: str, value: Val, streaming: bool = False) -> None:
        b, dtype = self.b, self.k.buffer(buffer).dtype
        base = self.ptr[buffer]
        if self.lanes is None or self._vector_stride(buffer) == 0:
            if isinstance(value, tuple):
                value = b.extract_element(value[0], ir.Constant(I32, 0))
            ptr = b.gep(base, [self._offset(buffer, skip_vector=self.lanes is not None)])
            memory.store_scalar(b, value, ptr, dtype)
            return
        offset = self._offset(buffer, skip_vector=False)
        for k, part in enumerate(self._parts(value)):
            if self._vector_stride(buffer) == 1:
                ptr = b.gep(base, [b.add(offset, ir.Constant(I64, k * self.w))])
                memory.store_vector(b, part, ptr, dtype, self.lanes.mask, streaming)
                continue
            for lane, off in enumerate(self._lane_offsets(buffer, offset, k)):
                x = b.extract_element(part, ir.Constant(I32, lane))
                if self.lanes.count is not None:  # masked-off lanes rewrite lane 0
                    active = b.icmp_signed("<", ir.Constant(I64, lane), self.lanes.count)
                    x = b.select(active, x, b.extract_element(part, ir.Constant(I32, 0)))
                memory.store_scalar(b, x, b.gep(base, [off]), dtype)

    # --- expressions --------------------------------------------------------------------
    def _const(self, value: float, ty: ir.Type) -> ir.Constant:
        if isinstance(ty, ir.VectorType):
            return ir.Constant(ty, [value] * ty.count)
        return ir.Constant(ty, value)

    def _parts(self, value: Val) -> tuple[ir.Value, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(splat(self.b, value, self.w) for _ in range(self.lanes.parts))

    def expr(self, e: kir.Expr) -> Val:
        if e in self.memo:
            return self.memo[e]
        if isinstance(e, kir.Load):
            v = self.load(e.buffer)
        elif isinstance(e, kir.Const):
            v = ir.Constant(F32, e.value)
        elif isinstance(e, kir.Dim):
            v = self.b.sitofp(self.size[e.axis], F32)
        elif isinstance(e, kir.Ref):
            v = self.env[e.name]
        else:
            v = self.call(e)
        self.memo[e] = v
        return v

    def call(self, e: kir.Call) -> Val:
        args = [self.expr(a) for a in e.args]
        if any(isinstance(a, tuple) for a in args):
            per_part = [self._parts(a) for a in args]
            if e.op in MATH_FUNCTIONS:  # unary; its long chains overlap across the parts
                return emit_math_parts(self.b, e.op, per_part[0], self.features)
            return tuple(self.op(e.op, list(xs)) for xs in zip(*per_part, strict=True))
        return self.op(e.op, args)

    def op(self, op: str, xs: list[ir.Value]) -> ir.Value:
        b = self.b
        ty = xs[-1].type
        binary = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}
        compare = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}
        if op in binary:
            return binary[op](*xs)
        if op in ("max", "min"):
            return self._minmax(op, *xs)
        scalar = ty.element if isinstance(ty, ir.VectorType) else ty
        if isinstance(scalar, ir.IntType) and op in (*compare, "ne"):  # bools (0 or 1)
            return b.icmp_unsigned({**compare, "ne": "!="}[op], *xs)
        if op in compare:
            return b.fcmp_ordered(compare[op], *xs)
        if op == "ne":
            return b.fcmp_unordered("!=", *xs)
        if op in ("and", "or"):
            return (b.and_ if op == "and" else b.or_)(*xs)
        if op == "select":
            return b.select(*xs)
        if op in MATH_FUNCTIONS:
            return emit_math(b, op, xs[0], self.features)
        if op in LLVM_UNARY or op == "pow":
            name = LLVM_UNARY.get(op, "pow")
            suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
            fn = intrinsic(b.module, f"llvm.{name}.{suffix}", ty, [ty] * len(xs))
            return b.call(fn, xs)
        (x,) = xs
        if op == "neg":
            return b.fneg(x)
        if op == "reciprocal":
            return b.fdiv(self._const(1.0, ty), x)
        if op == "relu":  # NaN stays NaN
            return b.select(b.fcmp_ordered("<", x, self._const(0.0, ty)), self._const(0.0, ty), x)
        if op in ("round_bf16", "round_f16"):
            return memory.round_to(b, x, op.removeprefix("round_"))
        raise AssertionError(f"kernel op {op} has no lowering")


def emit_kernel(
    kernel: kir.Kernel,
    schedule: Schedule,
    features: frozenset[str] = frozenset(),
    array_data_offset: int | None = None,
) -> str:
    """The LLVM IR module (text) for `kernel` run by `schedule` on a CPU with `features`.

    With `array_data_offset`, the module also exports `NAME.arrays`, which takes NumPy array
    objects (their addresses) instead of data pointers and reads each data pointer at that
    byte offset: from Python, `id(a)` costs 0.04 µs where `a.ctypes.data` costs 1-3 µs.
    """
    mod = ir.Module(kernel.name)
    body_fn = ir.Function(mod, WORKER, f"{kernel.name}.body")
    body_fn.linkage = "internal"
    em = _Emitter(kernel, schedule, body_fn, features)
    em.bind(*body_fn.args)
    em.stmts(kernel.body)
    if schedule.streaming_stores:  # non-temporal stores are weakly ordered: drain them
        em.b.fence("seq_cst")
    em.b.ret_void()

    nbuf = len(kernel.buffers)
    entry = ir.Function(mod, ir.FunctionType(ir.VoidType(), [I8P] * nbuf + [I64.as_pointer(), I32]),
                        kernel.name)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    ctx = b.alloca(ir.ArrayType(I8P, nbuf + 1))
    for i, arg in enumerate(entry.args[:nbuf]):
        b.store(arg, b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
    b.store(b.bitcast(entry.args[nbuf], I8P), b.gep(ctx, [ir.Constant(I32, 0),
                                                          ir.Constant(I32, nbuf)]))
    ctx8 = b.bitcast(ctx, I8P)
    nthreads = entry.args[nbuf + 1]
    if schedule.parallel_axis is None:
        b.call(body_fn, [ctx8, ir.Constant(I32, 0), ir.Constant(I32, 1)])
    else:
        parallel = ir.Function(mod, ir.FunctionType(ir.VoidType(), [WORKER.as_pointer(), I8P, I32]),
                               "tilefold_parallel")
        with b.if_else(b.icmp_signed(">", nthreads, ir.Constant(I32, 1))) as (many, one):
            with many:
                b.call(parallel, [body_fn, ctx8, nthreads])
            with one:
                b.call(body_fn, [ctx8, ir.Constant(I32, 0), ir.Constant(I32, 1)])
    b.ret_void()
    _emit_multi(mod, body_fn, kernel, schedule.parallel_axis is not None)
    if array_data_offset is not None:
        wrapper = ir.Function(mod, entry.function_type, f"{kernel.name}.arrays")
        b = ir.IRBuilder(wrapper.append_basic_block("entry"))
        data = [b.load(b.bitcast(b.gep(obj, [ir.Constant(I64, array_data_offset)]),
                                 I8P.as_pointer())) for obj in wrapper.args[:nbuf]]
        b.call(entry, [*data, *wrapper.args[nbuf:]])
        b.ret_void()
    return str(mod)


def _emit_multi(mod: ir.Module, body_fn: ir.Function, kernel: kir.Kernel,
                parallel: bool) -> None:
    """`NAME.multi(i64* table, i64 entries, i32 nthreads)`: the kernel over many tensors in one
    parallel call (a multi-tensor apply). Each table row is the body's context, the buffers'
    data pointers and the `params` pointer, then an owner: -1 splits the entry over every
    thread as a single call would, t runs it whole on thread t % nthreads (small entries).
    A kernel without a parallel axis (0-d tensors) runs every row on the calling thread."""
    nbuf = len(kernel.buffers)
    row = nbuf + 2
    worker = ir.Function(mod, WORKER, f"{kernel.name}.multi_body")
    worker.linkage = "internal"
    ctx, tid, nthreads = worker.args
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    header = b.bitcast(ctx, I64.as_pointer())
    table = b.inttoptr(b.load(header), I64.as_pointer())
    entries = b.load(b.gep(header, [ir.Constant(I64, 1)]))
    with for_range(b, ir.Constant(I64, 0), entries, name="entry") as e:
        slots = b.gep(table, [b.mul(e, ir.Constant(I64, row))])
        owner = b.load(b.gep(slots, [ir.Constant(I64, nbuf + 1)]))
        context = b.bitcast(slots, I8P)
        with b.if_else(b.icmp_signed("<", owner, ir.Constant(I64, 0))) as (split, whole):
            with split:
                b.call(body_fn, [context, tid, nthreads])
            with whole:
                mine = b.icmp_signed("==", b.srem(owner, b.sext(nthreads, I64)), b.sext(tid, I64))
                with b.if_then(mine):
                    b.call(body_fn, [context, ir.Constant(I32, 0), ir.Constant(I32, 1)])
    b.ret_void()

    entry = ir.Function(mod, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64, I32]),
                        f"{kernel.name}.multi")
    table, entries, nthreads = entry.args
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    header = b.alloca(ir.ArrayType(I64, 2))
    b.store(b.ptrtoint(table, I64), b.gep(header, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
    b.store(entries, b.gep(header, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
    header8 = b.bitcast(header, I8P)
    if not parallel:
        b.call(worker, [header8, ir.Constant(I32, 0), ir.Constant(I32, 1)])
        b.ret_void()
        return
    parallel = mod.globals.get("tilefold_parallel") or ir.Function(
        mod, ir.FunctionType(ir.VoidType(), [WORKER.as_pointer(), I8P, I32]), "tilefold_parallel")
    with b.if_else(b.icmp_signed(">", nthreads, ir.Constant(I32, 1))) as (many, one):
        with many:
            b.call(parallel, [worker, header8, nthreads])
        with one:
            b.call(worker, [header8, ir.Constant(I32, 0), ir.Constant(I32, 1)])
    b.ret_void()


__all__ = ["emit_kernel"]
