"""LTO: prebuilt library kernels (row sums, dot products) linked with a generated row loop and
epilogue, then inlined by LLVM: row sums/means over the last axis, and GEMV (matrix @ vector).
"""

from __future__ import annotations

import math

from tilefold.codegen.llvm.cpu.lto_rows import library_row_kernel
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem


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


@register_method
class RowLibrary(Method):
    name = "lto.rowlib"
    family = "lto"
    generators = ("tilefold.codegen.llvm.cpu",)

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
    shape = problem.shape(problem.body[0].operands[0])
    rows = math.prod(shape[:-1])  # not elements // n: with K = 0 every row is empty
    return Kernel.native(library_row_kernel(kind, problem.kernel_symbol(f"tf_lto_{kind}"), rows,
                                            shape[-1], ctx.target, ctx.threads))
