"""Row kernels that call the LTO library (`lto_library.py`) once a row: row sums and means over
the last axis, and GEMV; linked with the library and optimized, so the calls are inlined."""

from __future__ import annotations

import math

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.cpu.lto_library import link_library
from tilefold.codegen.llvm.cpu.rowkernel import (
    FP,
    RowKernel,
    emit_row_kernel,
    load_kernel,
    new_module,
    threads_for,
)
from tilefold.target import Target

OPT_LEVEL = 2  # the middle end must run: it is what inlines the library


def library_row_kernel(kind: str, name: str, rows: int, n: int, target: Target,
                       max_threads: int) -> RowKernel:
    """`name(x, y)` with y[r] = sum (or mean) of row r of the [rows, n] x, or for "gemv"
    `name(a, x, y)` with y[r] = dot(row r of a, x); one row per iteration, rows over threads."""
    module = new_module(name, target)
    lib = "tf_lib_dot" if kind == "gemv" else "tf_lib_row_sum"
    args = [FP, FP, u.i64] if kind == "gemv" else [FP, u.i64]
    fn = ir.Function(module, ir.FunctionType(u.f32, args), name=lib)
    nargs = 3 if kind == "gemv" else 2

    def body(b: ir.IRBuilder, ptrs, row, _):
        x = u.gep(b, ptrs[0], b.mul(row, u.const(n)))
        call_args = [x, ptrs[1], u.const(n)] if kind == "gemv" else [x, u.const(n)]
        value = b.call(fn, call_args)
        if kind == "mean":
            value = b.fmul(value, ir.Constant(u.f32, 1.0 / n if n else math.nan))  # NumPy: NaN
        b.store(value, u.gep(b, ptrs[-1], row))

    emit_row_kernel(module, name, nargs, rows, threads_for(4 * rows * n, max_threads), body)
    return load_kernel(link_library(str(module), target), target, name, nargs, OPT_LEVEL)
