"""Hand-written fused attention (`codegen.attention`) for `scaled_dot_product_attention`."""

from __future__ import annotations

import math

import numpy as np

from tilefold.runtime import emit_assembly
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

EFFICIENCY = 0.5  # of the GEMM peak: short dot products, a softmax and a K transpose per block


@register_method
class FlashAttention(Method):
    name = "handwritten.attention"
    family = "hand-written"
    generators = ("tilefold.codegen.attention", "tilefold.codegen.vecmath")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if reason := problem.not_lone("scaled_dot_product_attention"):
            return reason
        op = problem.body[0]
        types = [problem.types[v] for v in op.operands]
        if any(str(t.dtype) != "f32" for t in types[:3]):
            return "written for f32 q, k, v"
        if len(types) > 3 and str(types[3].dtype) not in ("f32", "bool"):
            return f"mask of {types[3].dtype} (bool and f32 masks only)"
        if any(len(t.shape) > 4 for t in types[:3]):
            return "more than two batch dims"
        if ctx.target.vector_bits < 128:
            return "needs a vector unit"
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, EFFICIENCY) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build(problem, ctx),
                               "one pass over key blocks, online softmax")]


def build(problem: Problem, ctx: Context) -> Kernel:
    # On first use: `import tilefold` does not load the attention generator.
    from tilefold.codegen.attention import AttentionConfig, attention_kernel

    op = problem.body[0]
    attrs = problem.attrs(op)
    q, v = problem.shape(op.operands[0]), problem.shape(op.operands[2])
    mask = "none"
    if len(op.operands) > 3:
        mask = "bool" if str(problem.types[op.operands[3]].dtype) == "bool" else "float"
    scale = attrs["scale"] if attrs["scale"] is not None else 1 / math.sqrt(q[-1])
    cfg = AttentionConfig(q[-1], v[-1], mask, attrs["is_causal"],
                          ctx.target.vector_bits // 32, ctx.threads, ctx.target.vector_registers)
    kernel = attention_kernel(cfg, ctx.target)

    if mask == "none":
        def run(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
            kernel(q, k, v, None, out, scale)

        def calls(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray):
            return kernel.calls(q, k, v, None, out, scale)
    else:
        def run(q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray,
                out: np.ndarray) -> None:
            kernel(q, k, v, m, out, scale)

        def calls(q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray,
                  out: np.ndarray):
            return kernel.calls(q, k, v, m, out, scale)

    def asm() -> str:
        return emit_assembly(kernel.source(), ctx.target, opt_level=2)

    return Kernel(run, f"// fused attention kernel for {cfg} (LLVM IR: see the assembly)", asm,
                  strided=True, strided_out=True, calls=calls)
