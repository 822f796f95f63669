"""Hand-written random numbers: a lone `random_uniform` as the SIMD counter-hash kernel
(`codegen/llvm/cpu/random.py`), bit for bit the reference's draw. Native, it replays with the rest
of a training step, its seed an argument of the call."""

from __future__ import annotations

import math

from tilefold.codegen.llvm.cpu.random import random_kernel
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

ELEMENT_S = 0.5e-9  # per number and thread: two integer mixes and a store, lanes at a time


@register_method
class RandomNumbers(Method):
    name = "handwritten.random"
    family = "hand-written"
    generators = ("tilefold.codegen.llvm.cpu.random", "tilefold.codegen.llvm.cpu.rowkernel",
                  "tilefold.ir.ops.random")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        why = problem.not_lone("random_uniform")
        if why is not None:
            return why
        op = problem.body[0]
        n = math.prod(problem.shape(op.results[0]))
        stream = problem.attrs(op)["stream"]
        estimate = ELEMENT_S * n / ctx.threads + ctx.machine.call_s

        def build() -> Kernel:
            return Kernel.native(random_kernel(n, stream, ctx.threads, ctx.target))
        return [self.candidate({}, estimate, build, "the counter hash in SIMD lanes")]
