"""Hand-written expert kernels registered for patterns (here: a row softmax)."""

from __future__ import annotations

import math

from tilefold.codegen.llvm.cpu.softmax import softmax_kernel
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem


@register_method
class ExpertSoftmax(Method):
    name = "handwritten.softmax"
    family = "hand-written"
    generators = ("tilefold.codegen.llvm.cpu", "tilefold.codegen.llvm.vecmath",
                  "tilefold.codegen.llvm.memory")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if reason := problem.not_lone("softmax"):
            return reason
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
    return Kernel.native(softmax_kernel(problem.kernel_symbol("tf_softmax"), rows, n,
                                        ctx.target, ctx.threads))
