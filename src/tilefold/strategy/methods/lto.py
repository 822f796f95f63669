"""LTO: prebuilt library kernels (row sums, dot products) linked with a generated row loop and
epilogue, then inlined by LLVM: row sums/means over the last axis, and GEMV (matrix @ vector).
"""

from __future__ import annotations

import math

from llvmlite import ir

from tilefold.codegen import llvm_util as u
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.kernels.lto_library import link_library
from tilefold.strategy.kernels.native import (
    FP,
    emit_row_kernel,
    kernel_name,
    load_kernel,
    new_module,
    threads_for,
)
from tilefold.strategy.method import Candidate, Context, Kernel, Method
from tilefold.strategy.problem import Problem

OPT_LEVEL = 2  # the middle end must run: it is what inlines the library


def _shape_kind(problem: Problem) -> str | None:
    """"sum"/"mean" for a last-axis row reduction, "gemv" for matrix @ vector, else None."""
    if len(problem.body) != 1 or any(str(t.dtype) != "f32" for t in problem.in_types()):
        return None
    op = problem.body[0]
    if op.name in ("reduce_sum", "reduce_mean"):
        rank = len(problem.shape(op.operands[0]))
        axes = op.attr("axes")
        if rank >= 1 and axes is not None and [a % rank for a in axes] == [rank - 1]:
            return op.name.removeprefix("reduce_")
    if op.name == "matmul" and not op.attr("transpose_a"):
        a, b = (problem.shape(v) for v in op.operands)
        if len(a) == 2 and (len(b) == 1 or (len(b) == 2 and b[1] == 1 and not
                                             op.attr("transpose_b"))):
            return "gemv"
    return None


class RowLibrary(Method):
    name = "lto.rowlib"
    family = "lto"

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        kind = _shape_kind(problem)
        if kind is None:
            return ("the library has row sums/means over the last axis and GEMV (f32); this "
                    "group is " + " -> ".join(problem.names))
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, 0.5, 0.8) + ctx.machine.call_s
        return [self.candidate({"kernel": kind}, estimate, lambda: build_rows(problem, ctx, kind),
                               "library call inlined after linking")]


def build_rows(problem: Problem, ctx: Context, kind: str) -> Kernel:
    """y[r] = lib(row r) (times 1/n for a mean), one row per iteration, rows over threads."""
    op = problem.body[0]
    shape = problem.shape(op.operands[0])
    n = shape[-1]
    rows = math.prod(shape[:-1])  # not elements // n: with K = 0 every row is empty
    name = kernel_name(f"tf_lto_{kind}", problem)
    module = new_module(name, ctx.target)
    lib = "tf_lib_dot" if kind == "gemv" else "tf_lib_row_sum"
    args = [FP, FP, u.i64] if kind == "gemv" else [FP, u.i64]
    fn = ir.Function(module, ir.FunctionType(u.f32, args), name=lib)
    nargs = len(problem.inputs) + 1

    def body(b: ir.IRBuilder, ptrs, row, _):
        x = u.gep(b, ptrs[0], b.mul(row, u.const(n)))
        call_args = [x, ptrs[1], u.const(n)] if kind == "gemv" else [x, u.const(n)]
        value = b.call(fn, call_args)
        if kind == "mean":
            value = b.fmul(value, ir.Constant(u.f32, 1.0 / n if n else math.nan))  # NumPy: NaN
        b.store(value, u.gep(b, ptrs[-1], row))

    emit_row_kernel(module, name, nargs, rows, threads_for(4 * rows * n, ctx.threads), body)
    return load_kernel(link_library(str(module), ctx.target), ctx.target, name, nargs, OPT_LEVEL)
