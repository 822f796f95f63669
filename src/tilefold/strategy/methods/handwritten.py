"""Hand-written expert kernels registered for patterns (here: a row softmax)."""

from __future__ import annotations

import math

from tilefold.strategy.cost import roofline, work
from tilefold.strategy.kernels.native import (
    emit_row_kernel,
    kernel_name,
    load_kernel,
    new_module,
    threads_for,
)
from tilefold.strategy.kernels.softmax import emit_softmax_row
from tilefold.strategy.method import Candidate, Context, Kernel, Method
from tilefold.strategy.problem import Problem


class ExpertSoftmax(Method):
    name = "handwritten.softmax"
    family = "hand-written"

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if problem.names != ("softmax",):
            return "pattern is a lone softmax; this group is " + " -> ".join(problem.names)
        op = problem.body[0]
        shape = problem.shape(op.operands[0])
        if op.attr("axis") % len(shape) != len(shape) - 1:
            return "softmax over a non-last axis (rows must be contiguous)"
        if str(problem.types[op.operands[0]].dtype) != "f32":
            return "written for f32"
        if shape[-1] < 1 or shape[-1] > 16384:
            return f"rows of {shape[-1]} do not stay in L1/L2 between sweeps"
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, 0.8, 0.9) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build_softmax(problem, ctx))]


def build_softmax(problem: Problem, ctx: Context) -> Kernel:
    shape = problem.shape(problem.inputs[0])
    n = shape[-1]
    rows = math.prod(shape[:-1])  # not elements // n: an empty row is still a row
    lanes = max(4, ctx.target.vector_bits // 32)
    name = kernel_name("tf_softmax", problem)
    module = new_module(name, ctx.target)
    features = ctx.target.features
    emit_row_kernel(module, name, 2, rows, threads_for(8 * rows * n, ctx.threads),
                    lambda b, ptrs, row, _: emit_softmax_row(b, ptrs[0], ptrs[1], row, n, lanes,
                                                             features))
    return load_kernel(str(module), ctx.target, name, 2)
