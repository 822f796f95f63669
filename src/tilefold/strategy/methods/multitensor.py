"""Multi-tensor: a `fused {members = K}` region (horizontal fusion: one elementwise chain over
K tensors, an optimizer's update of every parameter) as one native call over a table of the
members' pointers and lengths (`codegen/kernel/multi.py`), each output free to be its input's
own memory (the planner writes a donated parameter or moment in place)."""

from __future__ import annotations

import numpy as np

from tilefold.errors import UnsupportedError
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem
from tilefold.strategy.select import NATIVE_STEPS
from tilefold.target import Target


@register_method
class MultiTensor(Method):
    name = "multitensor"
    family = "auto-codegen"
    generators = ("tilefold.codegen.kernel", "tilefold.codegen.llvm", "tilefold.codegen.backend",
                  "tilefold.codegen.llvm.vecmath")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        op = problem.op
        if op.name != "fused" or op.attr("members") < 2:
            return "runs the multi-member regions of horizontal fusion only"
        if not isinstance(ctx.target, Target):
            return "the table entry is the LLVM backend's (CPU targets)"
        from tilefold.codegen.kernel.compile import lower_group  # on first use
        from tilefold.codegen.kernel.multi import member_template

        try:
            lower_group(member_template(op.regions[0], op.attr("members")), ctx.target)
        except UnsupportedError as exc:
            return exc.message
        w = work(problem)
        # one parallel call instead of one a member
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, 0.7, 0.8) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build(problem, ctx), "a table of tensors")]


def build(problem: Problem, ctx: Context) -> Kernel:
    from tilefold.codegen.kernel.multi import MultiTensorGroup  # on first use

    op = problem.op
    group = MultiTensorGroup(op.regions[0], op.attr("members"), ctx.target)

    def calls(*arrays: np.ndarray):
        # an exported plan: each member an ordinary kernel call (a table of raw pointers
        # cannot be relocated into an artifact)
        return group.member_calls(*arrays) if NATIVE_STEPS.get() else group.calls(*arrays)

    return Kernel(group, group.kernel_text, group.assembly, calls=calls, in_place=True)
