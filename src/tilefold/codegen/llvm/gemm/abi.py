"""The native call ABI every GEMM-shaped module shares: parameter block, worker set-up, entry, plan.

A module's entry `name(params, X, Y, Z, ws)` takes an int64 parameter block (the slots of a
`ParamBlock` subclass, filled once per shape by a `NativePlan`), three NumPy array objects (or
raw data pointers when the block's DATA_OFFSET slot is -1) and a workspace pointer. It runs the
module's worker on THREADS threads through `tilefold_parallel`; each worker gets ctx = [params,
X, Y, Z, ws] as data pointers (`emit_worker` reads them). The f32 GEMM and GEMV, the
low-precision GEMMs and the weight-only GEMV all use it, so none writes it again.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import threading
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.runtime import CompiledModule, compile_llvm_ir
from tilefold.runtime.arrays import DATA_OFFSET
from tilefold.runtime.buffers import aligned_empty
from tilefold.runtime.replay import NativeCall
from tilefold.target import Target

WORKER_TYPE = ir.FunctionType(u.void, [u.i8.as_pointer(), u.i32, u.i32])
PARALLEL_TYPE = ir.FunctionType(u.void, [WORKER_TYPE.as_pointer(), u.i8.as_pointer(), u.i32])
_I64P = u.i64.as_pointer()
_I8P = u.i8.as_pointer()
_P = ctypes.c_void_p
_OBJ = ctypes.py_object


class ParamBlock(enum.IntEnum):
    """Slots of a module's int64 parameter block. A subclass lists its slots from 0 and has
    DATA_OFFSET (where an array object keeps its data pointer; -1: raw pointers) and THREADS."""

    @classmethod
    def fill(cls, values: dict[int, int]) -> np.ndarray:
        """The block holding `values` (slot -> value; slots not given are 0)."""
        block = np.zeros(len(cls), np.int64)
        for slot, value in values.items():
            block[slot] = value
        return block


class _Workspace(threading.local):
    """Packing buffers, one per calling thread so concurrent calls never share them."""

    def __init__(self):
        self.buf = aligned_empty((0,), np.uint8)
        self.ptr = self.buf.ctypes.data  # kept: `.ctypes` costs a microsecond per call

    def get(self, nbytes: int) -> int:
        if self.buf.nbytes < nbytes:
            self.buf = aligned_empty((nbytes,), np.uint8)
            self.ptr = self.buf.ctypes.data
        return self.ptr


_workspace = _Workspace()


class Worker:
    """A worker function being emitted: its builder, thread index and count (i64), the operand
    pointers X, Y, Z, ws cast to the given types, and `self[slot]` loads a parameter."""

    def __init__(self, module: ir.Module, name: str, types: tuple[ir.Type, ...]):
        self.fn = ir.Function(module, WORKER_TYPE, name=name)
        self.fn.linkage = "internal"
        ctx, tid, nth = self.fn.args
        self.b = b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        fields = b.bitcast(ctx, _I64P)
        self.params = b.inttoptr(b.load(u.gep(b, fields, 0)), _I64P)
        self.x, self.y, self.z, self.ws = (b.inttoptr(b.load(u.gep(b, fields, i)), ty)
                                           for i, ty in enumerate(types, 1))
        self.tid, self.nth = b.sext(tid, u.i64), b.sext(nth, u.i64)

    def __getitem__(self, slot: ParamBlock) -> ir.Value:
        return self.b.load(u.gep(self.b, self.params, int(slot)))


def emit_worker(module: ir.Module, name: str, x: ir.Type, y: ir.Type, z: ir.Type,
                ws: ir.Type = _I8P) -> Worker:
    """Start the worker `name(ctx, tid, nth)` with X, Y, Z and ws as pointers of these types;
    the caller emits the body with `worker.b` and returns `worker.fn`."""
    return Worker(module, name, (x, y, z, ws))


def emit_entry(module: ir.Module, worker: ir.Function, name: str,
               block: type[ParamBlock]) -> ir.Function:
    """`name(params, X, Y, Z, ws)`: one native call runs `worker` on `params[block.THREADS]`
    threads with ctx = [params, X, Y, Z, ws] (data pointers).

    X, Y, Z are NumPy array objects whose data pointers are read here (≈ 1 µs per operand less
    than `ndarray.ctypes.data` in Python), or raw pointers when `params[block.DATA_OFFSET]` is
    -1. Compiled at -O0: it runs once per call."""
    i8p = u.i8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(u.void, [_I64P, i8p, i8p, i8p, u.f32.as_pointer()]),
                     name=name)
    unoptimized(fn)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    params = fn.args[0]
    ctx = b.alloca(ir.ArrayType(u.i64, 5), name="ctx")
    slots = b.bitcast(ctx, u.i64.as_pointer())
    offset = b.load(u.gep(b, params, int(block.DATA_OFFSET)))
    objects = b.icmp_signed(">=", offset, u.const(0))
    for i, arg in enumerate(fn.args):
        if i in (1, 2, 3):
            with b.if_else(objects) as (from_object, raw):
                with from_object:
                    field = b.bitcast(b.gep(arg, [offset]), u.i64.as_pointer())
                    b.store(b.load(field), u.gep(b, slots, i))
                with raw:
                    b.store(b.ptrtoint(arg, u.i64), u.gep(b, slots, i))
        else:
            b.store(b.ptrtoint(arg, u.i64), u.gep(b, slots, i))
    threads = b.trunc(b.load(u.gep(b, params, int(block.THREADS))), u.i32)
    ctx8 = b.bitcast(ctx, u.i8.as_pointer())
    with b.if_else(b.icmp_signed("<=", threads, u.const(1, u.i32))) as (single, many):
        with single:
            b.call(worker, [ctx8, u.const(0, u.i32), u.const(1, u.i32)])
        with many:
            par = u.intrinsic(module, "tilefold_parallel", u.void, list(PARALLEL_TYPE.args))
            b.call(par, [worker, ctx8, threads])
    b.ret_void()
    return fn


def unoptimized(fn: ir.Function) -> None:
    """Compile `fn` at -O0 (fast instruction selection and register allocation): for code that
    runs once per call or per sub-block, where the optimizing backend cost a tenth of the
    module's compile time and its speed does not show."""
    fn.attributes.add("noinline")
    fn.attributes.add("optnone")


Entries = tuple[Callable[..., None], Callable[..., None]]


def entry_points(compiled: CompiledModule, name: str) -> Entries:
    """The ctypes functions of entry `name`: taking array objects, and taking raw pointers."""
    return (compiled.function(name, None, _P, _OBJ, _OBJ, _OBJ, _P),
            compiled.function(name, None, _P, _P, _P, _P, _P))


@functools.cache
def compiled_entries(target: Target, name: str, entry: str, generator: Callable[..., str],
                     *args: object) -> Entries:
    """The entry points of the module `generator(*args)` writes (LLVM IR text), compiled for
    `target` once per process (its object code is cached on disk, keyed by the IR)."""
    return entry_points(compile_llvm_ir(generator(*args), target, name=name), entry)


class NativePlan:
    """A filled parameter block and the entry it is for: `run(x, y, z)` is one native call."""

    ws_bytes = 0

    def __init__(self, entries: Entries, block: type[ParamBlock], values: dict[int, int]):
        entry_objects, entry_raw = entries
        self.params = block.fill(values)
        self.pointed: tuple[np.ndarray, ...] = ()  # arrays whose addresses `params` holds
        self._params_ptr = self.params.ctypes.data
        if DATA_OFFSET >= 0:  # native code reads the data pointers out of the array objects
            self._entry = entry_objects
        else:
            def _entry(params, x, y, z, ws):
                entry_raw(params, x.ctypes.data, y.ctypes.data, z.ctypes.data, ws)
            self._entry = _entry

    def run(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> None:
        """One native call. The caller guarantees the shapes, strides and dtypes planned for."""
        self._entry(self._params_ptr, x, y, z, _workspace.get(self.ws_bytes))

    def call(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> NativeCall | None:
        """`run(x, y, z)` as a call to replay (with a workspace of its own), or None where
        the entry reads raw pointers through Python."""
        if DATA_OFFSET < 0:
            return None
        ws = aligned_empty((max(self.ws_bytes, 1),), np.uint8)
        return NativeCall(self._entry, (self._params_ptr, x, y, z, ws.ctypes.data),
                          (self.params, *self.pointed), (ws,))
