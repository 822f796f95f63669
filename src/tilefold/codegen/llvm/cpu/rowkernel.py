"""The calling convention of tilefold's hand-built CPU row kernels, and loading them.

`entry(PyObject *a0, ..., PyObject *an)`: the arguments are NumPy arrays (inputs, then
outputs); their data pointers are read at `DATA_OFFSET` inside the native code, so a call costs
one ctypes dispatch. The entry stores the pointers in a context array and runs
`worker(ctx, tid, nthreads)` on the runtime's pool (`tilefold_parallel`) or inline. A kernel
made for any number of rows (`rows=None`: every row count of a symbolic shape runs one compiled
kernel) takes one more array, int64 [rows, threads].
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.gemm.abi import DATA_OFFSET, PARALLEL_TYPE, WORKER_TYPE
from tilefold.errors import UnsupportedError
from tilefold.runtime import compile_generated, compile_llvm_ir, emit_assembly, source_digest
from tilefold.runtime.thread_pool import thread_pool
from tilefold.target import Target

FP = u.f32.as_pointer()
# Below this many bytes touched a second thread costs more (wake-up) than it saves.
PARALLEL_MIN_BYTES = 256 * 1024


@dataclass(frozen=True)
class RowKernel:
    """A loaded row kernel: `function(*arrays)` takes the inputs, then the outputs; `source`
    is its LLVM IR or a function making it (a kernel loaded by fingerprint never built it).
    `native` is the ctypes entry, called with the arrays and then `bound` (a kernel made for
    any row count: its int64 [rows, threads])."""

    native: Callable[..., None]
    source: str | Callable[[], str]
    assembly: Callable[[], str]
    bound: tuple = ()

    @property
    def function(self) -> Callable[..., None]:
        if not self.bound:
            return self.native
        native, bound = self.native, self.bound
        return lambda *arrays: native(*arrays, *bound)


class RowEmitter(Protocol):
    """What emits one row of a generated row kernel: per-thread state, then each row."""

    def row_buffers(self, b: ir.IRBuilder) -> Any: ...

    def emit(self, b: ir.IRBuilder, ptrs: list[ir.Value], row: ir.Value, state: Any) -> None: ...


def threads_for(nbytes: int, threads: int) -> int:
    """`threads` when touching `nbytes` repays waking them, else 1."""
    return threads if nbytes >= PARALLEL_MIN_BYTES else 1


def row_range(b: ir.IRBuilder, rows: int | ir.Value, tid: ir.Value, nth: ir.Value) -> tuple:
    """This thread's rows [r0, r1) of `rows`, split evenly."""
    t, n = b.sext(tid, u.i64), b.sext(nth, u.i64)
    total = u.const(rows) if isinstance(rows, int) else rows
    r0 = b.sdiv(b.mul(total, t), n)
    r1 = b.sdiv(b.mul(total, b.add(t, u.const(1))), n)
    return r0, r1


def emit_row_kernel(module: ir.Module, name: str, nargs: int, rows: int | None,
                    threads: int | None,
                    body: Callable[[ir.IRBuilder, list[ir.Value], ir.Value, Any], None],
                    setup: Callable[[ir.IRBuilder], Any] = lambda b: None,
                    streaming: bool = False) -> None:
    """Add `name(a0..an)` running `body(builder, data_pointers, row, state)` for every row;
    `state = setup(builder)` is made once per thread (e.g. row buffers on its stack).
    `rows` (and `threads`) None: they come at run time, in an int64 array after the others.
    `streaming`: the body stores non-temporally, so each thread drains its stores at the end
    (they are weakly ordered)."""
    if DATA_OFFSET < 0:
        raise UnsupportedError("this Python keeps NumPy data pointers where tilefold cannot read "
                               "them; native kernels are unavailable (extern still works)")
    worker = ir.Function(module, WORKER_TYPE, name=f"{name}_worker")
    worker.linkage = "internal"
    ctx, tid, nth = worker.args
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    slots = b.bitcast(ctx, u.i64.as_pointer())
    ptrs = [b.inttoptr(b.load(u.gep(b, slots, i)), FP, name=f"p{i}") for i in range(nargs)]
    state = setup(b)
    if rows is None:  # [rows, threads], the argument after the arrays
        sizes = b.inttoptr(b.load(u.gep(b, slots, nargs)), u.i64.as_pointer(), name="sizes")
        r0, r1 = row_range(b, b.load(sizes, name="rows"), tid, nth)
    else:
        r0, r1 = row_range(b, rows, tid, nth)
    with u.for_range(b, r0, r1, name="row") as row:
        body(b, ptrs, row, state)
    if streaming:
        b.fence("seq_cst")
    b.ret_void()

    i8p = u.i8.as_pointer()
    total = nargs + (rows is None)
    entry = ir.Function(module, ir.FunctionType(u.void, [i8p] * total), name=name)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    ctx_array = b.alloca(ir.ArrayType(u.i64, total), name="ctx")
    slots = b.bitcast(ctx_array, u.i64.as_pointer())
    for i, obj in enumerate(entry.args):
        field = b.bitcast(b.gep(obj, [u.const(DATA_OFFSET)]), u.i64.as_pointer())
        b.store(b.load(field), u.gep(b, slots, i))
    ctx8 = b.bitcast(ctx_array, i8p)
    if threads is None:
        sizes = b.inttoptr(b.load(u.gep(b, slots, nargs)), u.i64.as_pointer())
        count = b.trunc(b.load(u.gep(b, sizes, 1)), u.i32, name="threads")
        parallel = b.icmp_signed(">", count, u.const(1, u.i32))
    else:
        count, parallel = u.const(threads, u.i32), ir.Constant(u.i1, threads > 1)
    with b.if_else(parallel) as (pool, inline):
        with pool:
            if threads is None or threads > 1:
                par = u.intrinsic(module, "tilefold_parallel", u.void, list(PARALLEL_TYPE.args))
                b.call(par, [worker, ctx8, count])
        with inline:
            b.call(worker, [ctx8, u.const(0, u.i32), u.const(1, u.i32)])
    b.ret_void()


def new_module(name: str, target: Target) -> ir.Module:
    module = ir.Module(name=name)
    module.triple = target.triple
    return module


def load_kernel(llvm_ir: str, target: Target, name: str, nargs: int, opt_level: int = 0
                ) -> RowKernel:
    """Compile (or fetch from the disk cache) and load `name(a0..an)`."""
    if "tilefold_parallel" in llvm_ir and target.is_host():
        thread_pool()  # llvmlite quotes the name, which compile_llvm_ir's check misses
    compiled = compile_llvm_ir(llvm_ir, target, name=name, opt_level=opt_level)
    fn = compiled.function(name, None, *([ctypes.py_object] * nargs))
    return RowKernel(fn, llvm_ir, lambda: emit_assembly(llvm_ir, target, opt_level=opt_level))


# The modules whose code shapes a generated row kernel (with its row emitter's: the caller's).
GENERATORS = ("tilefold.codegen.llvm.cpu.rowkernel", "tilefold.codegen.llvm",
              "tilefold.codegen.llvm.vecmath")


def generated_row_kernel(fingerprint: str, prefix: str, nargs: int, rows: int, n: int,
                         max_threads: int, target: Target,
                         make_emitter: Callable[[], RowEmitter]) -> RowKernel:
    """The row kernel `prefix_<digest>(a0..an)` whose rows `make_emitter()` emits, when
    `fingerprint` (the emitter's source digest and parameters, never the row count) determines
    its IR: a warm process loads the object without building the IR at all, and one compiled
    kernel serves every row count (the symbol follows the fingerprint, so every problem with
    this fingerprint shares it). Each argument is at most a [rows, n] f32 array; the returned
    function takes them, with this `rows` and its thread count bound."""
    key = f"{source_digest(*GENERATORS)}|{fingerprint}|{nargs}"
    name = f"{prefix}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def make_ir() -> str:
        emitter = make_emitter()
        module = new_module(name, target)
        emit_row_kernel(module, name, nargs, None, None, emitter.emit, emitter.row_buffers)
        return str(module)

    compiled = compile_generated(f"{key}|{name}", make_ir, target, name=name, uses_pool=True)
    fn = compiled.function(name, None, *([ctypes.py_object] * (nargs + 1)))
    sizes = np.array([rows, threads_for(4 * rows * n * nargs, max_threads)], np.int64)
    return RowKernel(fn, make_ir, lambda: emit_assembly(make_ir(), target), (sizes,))
