"""Auto-codegen: the kernel IR + schedule generator (`tilefold.codegen.kernel`) for memory-bound
groups: elementwise chains, reductions along any axis, softmax and norms in one loop nest.
"""

from __future__ import annotations

import numpy as np

from tilefold.errors import UnsupportedError
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Kernel, Method
from tilefold.strategy.problem import Problem


class KernelCodegen(Method):
    name = "autocodegen.kernel"
    family = "auto-codegen"

    def propose(self, problem, ctx):
        from tilefold.codegen.kernel.from_graph import analyze_group

        if problem.op.name != "fused":
            return "runs fused regions only; this op stands alone"
        if problem.kind == "compute":
            return "compute groups belong to the GEMM building blocks"
        try:
            analyze_group(problem.op.regions[0])
        except UnsupportedError as exc:
            return exc.message
        w = work(problem)
        out_bytes = sum(4.0 * np.prod(t.shape) for t in problem.out_types())
        # The compiled group returns fresh outputs, which are copied into the planned buffers.
        estimate = (roofline(w.flops, w.bytes_fused + 2 * out_bytes, ctx.machine, 0.7, 0.8)
                    + 2 * ctx.machine.call_s)
        return [self.candidate({}, estimate, lambda: build(problem, ctx),
                               "outputs copied (no out= in compile_group)")]


def build(problem: Problem, ctx) -> Kernel:
    from tilefold.codegen.kernel.compile import compile_group, lower_group
    from tilefold.codegen.kernel.printer import print_kernel

    region = problem.op.regions[0]
    group = compile_group(region, ctx.target)
    n_in = len(problem.inputs)

    def run(*arrays: np.ndarray) -> None:
        for out, result in zip(arrays[n_in:], group(*arrays[:n_in]), strict=True):
            np.copyto(out, result)

    return Kernel(run, print_kernel(*lower_group(region, ctx.target)), strided=True)
