"""Auto-codegen: the kernel IR + schedule generator (`tilefold.codegen.kernel`) for memory-bound
groups: elementwise chains, reductions along any axis, softmax and norms in one loop nest,
compiled by the first registered code generation backend that supports the kernel and target.
"""

from __future__ import annotations

import numpy as np

from tilefold.errors import UnsupportedError
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem


@register_method
class KernelCodegen(Method):
    name = "autocodegen.kernel"
    family = "auto-codegen"
    generators = ("tilefold.codegen.kernel", "tilefold.codegen.llvm", "tilefold.codegen.backend",
                  "tilefold.codegen.llvm.vecmath")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        # On first use: `import tilefold` does not load the kernel-IR generator.
        from tilefold.codegen.backend import BACKENDS
        from tilefold.codegen.kernel.compile import lower_group

        if problem.op.name != "fused":
            return "runs fused regions only; this op stands alone"
        if problem.kind == "compute":
            return "compute groups belong to the GEMM building blocks"
        if problem.op.attr("members") > 1:
            return "a region of several members (horizontal fusion) is the multi-tensor kernel's"
        try:
            kernel, _ = lower_group(problem.op.regions[0], ctx.target)
        except UnsupportedError as exc:
            return exc.message
        reasons = {name: b.supports(kernel, ctx.target) for name, b in BACKENDS.items()}
        backend = next((name for name, reason in reasons.items() if reason is None), None)
        if backend is None:
            return "; ".join(f"backend {name}: {reason}" for name, reason in reasons.items())
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, 0.7, 0.8) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build(problem, ctx, backend),
                               f"{backend} backend")]


def build(problem: Problem, ctx: Context, backend: str) -> Kernel:
    # On first use, as in `propose`.
    from tilefold.codegen.kernel.compile import compile_group

    region = problem.op.regions[0]
    group = compile_group(region, ctx.target, backend)
    n_in = len(problem.inputs)

    def run(*arrays: np.ndarray) -> None:
        group(*arrays[:n_in], out=list(arrays[n_in:]))  # the planner's outputs are contiguous

    def calls(*arrays: np.ndarray):
        return group.calls(*arrays[:n_in], out=list(arrays[n_in:]))

    return Kernel(run, group.kernel_text, group.assembly, strided=True, calls=calls)
