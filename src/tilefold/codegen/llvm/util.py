"""Small llvmlite IR-builder helpers shared by code generators: loops, intrinsics, vectors; and
IR written as text, for generators whose instruction count makes llvmlite's builder slow."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

i1 = ir.IntType(1)
i8 = ir.IntType(8)
i32 = ir.IntType(32)
i64 = ir.IntType(64)
f32 = ir.FloatType()
void = ir.VoidType()


def const(value: int, ty: ir.Type = i64) -> ir.Constant:
    return ir.Constant(ty, value)


def vec(ty: ir.Type, lanes: int) -> ir.VectorType:
    return ir.VectorType(ty, lanes)


class _Zeros(ir.Constant):
    """All zeros of a vector type, printed as `zeroinitializer` (llvmlite lists every element)."""

    def _get_reference(self) -> str:
        return "zeroinitializer"


def zeros(ty: ir.VectorType) -> ir.Constant:
    """All zeros (also as a shuffle mask): a vector spelled out costs more to print and parse
    than the instruction using it."""
    return _Zeros(ty, [0] * ty.count)


def _value(x: ir.Value | int, ty: ir.Type = i64) -> ir.Value:
    return x if isinstance(x, ir.Value) else const(x, ty)


def _loop_head(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, inits: list[ir.Value],
               name: str) -> tuple[ir.Block, ir.Block, ir.PhiInstr, list[ir.PhiInstr]]:
    """Branch to a head block testing `index < stop`, with phis for the index and for each of
    `inits`, and leave `b` in the body. Returns (head, done, index, phis); `_loop_tail` closes."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    idx = b.phi(stop.type, name=name)
    idx.add_incoming(start, pre)
    phis = []
    for init in inits:
        phi = b.phi(init.type)
        phi.add_incoming(init, pre)
        phis.append(phi)
    b.cbranch(b.icmp_signed("<", idx, stop), body, done)
    b.position_at_end(body)
    return head, done, idx, phis


def _loop_tail(b: ir.IRBuilder, head: ir.Block, done: ir.Block, idx: ir.PhiInstr,
               nxt: ir.Value) -> None:
    """Feed the next index back to the head and continue after the loop."""
    idx.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)


@contextmanager
def for_range(b: ir.IRBuilder, start: ir.Value | int, stop: ir.Value | int,
              step: ir.Value | int = 1, name: str = "i") -> Iterator[ir.Value]:
    """`for (i = start; i < stop; i += step)` with a phi induction variable (no allocas)."""
    start = _value(start)
    stop = _value(stop)
    step = _value(step, stop.type)
    head, done, idx, _ = _loop_head(b, start, stop, [], name)
    yield idx
    _loop_tail(b, head, done, idx, b.add(idx, step, name=f"{name}.next"))


class Carried:
    """Loop-carried values of `for_range_carry`: read `values`, set `next`; `result` after."""

    def __init__(self, index: ir.Value, values: list[ir.Value]):
        self.index = index
        self.values = values
        self.next: list[ir.Value] = values
        self.result: list[ir.Value] = values


@contextmanager
def for_range_carry(b: ir.IRBuilder, start: ir.Value | int, stop: ir.Value | int,
                    step: ir.Value | int, inits: list[ir.Value],
                    name: str = "i") -> Iterator[Carried]:
    """`for_range` whose body updates values kept in phis (registers) across iterations."""
    start = _value(start)
    stop = _value(stop)
    step = _value(step, stop.type)
    head, done, idx, phis = _loop_head(b, start, stop, inits, name)
    loop = Carried(idx, phis)
    yield loop
    for phi, value in zip(phis, loop.next, strict=True):
        phi.add_incoming(value, b.block)
    _loop_tail(b, head, done, idx, b.add(idx, step, name=f"{name}.next"))
    loop.result = phis


@contextmanager
def for_chunks(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, sizes: tuple[int, ...],
               name: str = "i") -> Iterator[tuple[ir.Value, ir.Value]]:
    """Walk [start, stop) in chunks, each the largest of `sizes` (descending, ending in 1) that
    fits; yields (index, chunk) so tails need a few fixed-size code paths instead of padding."""
    head, done, idx, _ = _loop_head(b, start, stop, [], name)
    left = b.sub(stop, idx)
    chunk = const(sizes[-1], stop.type)
    for size in reversed(sizes[:-1]):
        chunk = b.select(b.icmp_signed(">=", left, const(size, stop.type)),
                         const(size, stop.type), chunk)
    yield idx, chunk
    _loop_tail(b, head, done, idx, b.add(idx, chunk, name=f"{name}.next"))


def smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """Declare (once) an LLVM intrinsic or external function in `module`."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(ret, args), name=name)


def fma_intrinsic(module: ir.Module, ty: ir.Type) -> ir.Function:
    """`llvm.fma` for f32 or a vector of f32, declared in `module`."""
    suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
    return intrinsic(module, f"llvm.fma.{suffix}", ty, [ty, ty, ty])


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    """x*y + acc with one rounding (`llvm.fma.*`), which lowers to the target's vector FMA."""
    return b.call(fma_intrinsic(b.module, x.type), [x, y, acc])


def splat(b: ir.IRBuilder, scalar: ir.Value, lanes: int) -> ir.Value:
    """Broadcast a scalar to every lane (folds into `{1toN}` memory operands on AVX-512)."""
    ty = vec(scalar.type, lanes)
    undef = ir.Constant(ty, ir.Undefined)  # only lane 0 is ever read
    one = b.insert_element(undef, scalar, const(0, i32))
    return b.shuffle_vector(one, undef, zeros(vec(i32, lanes)))


def lane_splat(b: ir.IRBuilder, vector: ir.Value, lane: int) -> ir.Value:
    """Broadcast one lane of a vector (folds into NEON's `fmla ... v.s[lane]`)."""
    n = vector.type.count
    return b.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined),
                            ir.Constant(vec(i32, n), [lane] * n))


def lane_mask(b: ir.IRBuilder, count: ir.Value, lanes: int) -> ir.Value:
    """<lanes x i1> with the first `count` lanes set."""
    iota = ir.Constant(vec(i32, lanes), list(range(lanes)))
    return b.icmp_signed("<", iota, splat(b, b.trunc(count, i32) if count.type != i32 else count,
                                           lanes))


def masked_load_intrinsic(module: ir.Module, lanes: int) -> ir.Function:
    """`llvm.masked.load` of <lanes x float>, declared in `module`."""
    ty = vec(f32, lanes)
    return intrinsic(module, f"llvm.masked.load.v{lanes}f32.p0", ty,
                     [ty.as_pointer(), i32, vec(i1, lanes), ty])


def masked_load(b: ir.IRBuilder, ptr: ir.Value, mask: ir.Value, lanes: int) -> ir.Value:
    """Load the lanes of `mask` from `ptr` (a pointer to <lanes x float>), zeros elsewhere."""
    return b.call(masked_load_intrinsic(b.module, lanes),
                  [ptr, const(4, i32), mask, zeros(vec(f32, lanes))])


def masked_store_intrinsic(module: ir.Module, lanes: int) -> ir.Function:
    """`llvm.masked.store` of <lanes x float>, declared in `module`."""
    ty = vec(f32, lanes)
    return intrinsic(module, f"llvm.masked.store.v{lanes}f32.p0", void,
                     [ty, ty.as_pointer(), i32, vec(i1, lanes)])


def masked_store(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, mask: ir.Value) -> None:
    """Store the lanes of `mask` of `value` to `ptr`; memory under other lanes is not touched."""
    b.call(masked_store_intrinsic(b.module, value.type.count), [value, ptr, const(4, i32), mask])


def prefetch_intrinsic(module: ir.Module) -> ir.Function:
    """`llvm.prefetch`, declared in `module`."""
    return intrinsic(module, "llvm.prefetch.p0", void, [i8.as_pointer(), i32, i32, i32])


def prefetch(b: ir.IRBuilder, ptr: ir.Value, write: bool = False, locality: int = 3) -> None:
    p8 = b.bitcast(ptr, i8.as_pointer())
    b.call(prefetch_intrinsic(b.module),
           [p8, const(int(write), i32), const(locality, i32), const(1, i32)])


def gep(b: ir.IRBuilder, ptr: ir.Value, offset: ir.Value | int) -> ir.Value:
    offset = _value(offset)
    return b.gep(ptr, [offset], inbounds=True)


def float_buffer(b: ir.IRBuilder, floats: int, name: str) -> ir.Value:
    """A 64-byte aligned stack buffer of `floats` f32s, as a float pointer."""
    ptr = b.alloca(ir.ArrayType(f32, floats), name=name)
    ptr.align = 64
    return b.bitcast(ptr, f32.as_pointer())


def vptr(b: ir.IRBuilder, ptr: ir.Value, lanes: int) -> ir.Value:
    """View a float pointer as a pointer to <lanes x float>."""
    return b.bitcast(ptr, vec(f32, lanes).as_pointer())


class IRText:
    """A function body as lines of LLVM IR text with fresh value names: `t("fadd float %x, %y")`
    appends `%tN = fadd float %x, %y` and returns `%tN`.

    llvmlite's builder makes and prints about ten Python objects per instruction (~0.1 ms for a
    vector FMA); a line of text costs a few microseconds, which matters for generators that emit
    thousands of instructions on a first call."""

    def __init__(self):
        self.lines: list[str] = []
        self._names = itertools.count(1)

    def __call__(self, rhs: str) -> str:
        name = f"%t{next(self._names)}"
        self.lines.append(f"  {name} = {rhs}")
        return name

    def emit(self, line: str) -> None:
        """An instruction without a result (store, call void, br) or with a chosen name."""
        self.lines.append(f"  {line}")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")


class TextFunction(ir.Function):
    """A function whose whole definition is IR text (`define ... { ... }`) written by its
    generator; in the module it is a function like any other (callable, usable in constants).
    The intrinsics it calls must be declared in the module (see `intrinsic`)."""

    def __init__(self, module: ir.Module, ftype: ir.FunctionType, name: str, text: str):
        super().__init__(module, ftype, name)
        self.text = text

    def descr(self, buf: list[str]) -> None:
        buf.append(self.text)
