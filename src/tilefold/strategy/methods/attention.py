"""Hand-written fused attention (`codegen/llvm/attention`) for `scaled_dot_product_attention`: the
flash kernel for prompts, the decode kernel for a few query rows against a long cache; and a
training step's `attention_forward` (the flash kernel, with each row's log-sum-exp) and
`attention_backward` (the flash backward)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tilefold.runtime import emit_assembly
from tilefold.runtime.arrays import STRIDES_OFFSET
from tilefold.strategy.cost import roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

EFFICIENCY = 0.5  # of the GEMM peak: short dot products, a softmax and a K transpose per block
# The flash kernel transposes each key block once per task (batch, head, 128 query rows) with
# scalar moves: about this many K elements a second and thread (Zen 4: 640 us for 9 heads of
# 2048 x 64 keys and one query row), which a decode step pays per query head.
PACK_RATE = 2e9
DECODE_ROWS = 8  # query rows per head the decode kernel takes; longer queries are prompts
# Of the FMA peak: per key and query row, E + Ev FMAs and a butterfly folding the dot products.
DECODE_EFFICIENCY = 0.5


def _refusal(problem: Problem, ctx: Context, op_name: str = "scaled_dot_product_attention"
             ) -> str | None:
    """Why no attention kernel takes the problem (a lone `op_name`), or None."""
    if reason := problem.not_lone(op_name):
        return reason
    op = problem.body[0]
    types = [problem.types[v] for v in op.operands]
    if op_name == "scaled_dot_product_attention":
        if len(types) > 3 and str(types[3].dtype) not in ("f32", "bool"):
            return f"mask of {types[3].dtype} (bool and f32 masks only)"
        types = types[:3]
    if any(str(t.dtype) != "f32" for t in types):
        return "written for f32"
    if any(len(t.shape) > 4 for t in types):
        return "more than two batch dims"
    if ctx.target.vector_bits < 128:
        return "needs a vector unit"
    if STRIDES_OFFSET < 0:
        return ("this NumPy lays out array objects differently; the fused kernel cannot read "
                "their dims and strides")
    return None


@register_method
class FlashAttention(Method):
    name = "handwritten.attention"
    family = "hand-written"
    generators = ("tilefold.codegen.llvm.attention", "tilefold.codegen.llvm.vecmath")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if reason := _refusal(problem, ctx):
            return reason
        op = problem.body[0]
        q, k = problem.shape(op.operands[0]), problem.shape(op.operands[1])
        tasks = math.prod(problem.shape(op.results[0])[:-2]) * -(-q[-2] // 128)
        pack = tasks * k[-2] * k[-1] / (PACK_RATE * ctx.threads)
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, EFFICIENCY) + pack + \
            ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build(problem, ctx, decode=False),
                               "one pass over key blocks, online softmax")]


@register_method
class DecodeAttention(Method):
    name = "handwritten.decode_attention"
    family = "hand-written"
    generators = ("tilefold.codegen.llvm.attention", "tilefold.codegen.llvm.vecmath")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if reason := _refusal(problem, ctx):
            return reason
        op = problem.body[0]
        if (rows := problem.shape(op.operands[0])[-2]) > DECODE_ROWS:
            return f"{rows} query rows: more than {DECODE_ROWS}, a prompt (the flash kernel's)"
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, DECODE_EFFICIENCY) + \
            ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: build(problem, ctx, decode=True),
                               "K/V read once per key/value head, split over threads by key")]


class _TrainingAttention(Method):
    """A training graph's attention op (`op`) as its fused kernel, made by `make`."""

    family = "hand-written"
    generators = ("tilefold.codegen.llvm.attention", "tilefold.codegen.llvm.vecmath")
    op: str
    note: str

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if reason := _refusal(problem, ctx, self.op):
            return reason
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, EFFICIENCY) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: self.make(problem, ctx), self.note)]

    def make(self, problem: Problem, ctx: Context) -> Kernel:
        raise NotImplementedError


@register_method
class FlashAttentionForward(_TrainingAttention):
    name = "handwritten.attention_forward"
    op = "attention_forward"
    note = "the flash kernel, with each row's log-sum-exp"

    def make(self, problem: Problem, ctx: Context) -> Kernel:
        from tilefold.codegen.llvm.attention import AttentionConfig, attention_kernel

        op = problem.body[0]
        e, ev = problem.shape(op.operands[0])[-1], problem.shape(op.operands[2])[-1]
        scale = _scale(problem.attrs(op)["scale"], e)
        bias = len(op.operands) > 3
        cfg = AttentionConfig(e, ev, "float" if bias else "none", False,
                              ctx.target.vector_bits // 32, ctx.threads,
                              ctx.target.vector_registers, lse=True)
        return _bound(attention_kernel(cfg, ctx.target), ctx, "fused attention with log-sum-exp",
                      lambda a: (*a[:3], a[3] if bias else None, a[-2], scale, a[-1]))


@register_method
class FlashAttentionBackward(_TrainingAttention):
    name = "handwritten.attention_backward"
    op = "attention_backward"
    note = "probabilities recomputed per key block, in cache"

    def make(self, problem: Problem, ctx: Context) -> Kernel:
        from tilefold.codegen.llvm.attention import BackwardConfig, backward_kernel

        op = problem.body[0]
        e, ev = problem.shape(op.operands[1])[-1], problem.shape(op.operands[3])[-1]
        scale = _scale(problem.attrs(op)["scale"], e)
        bias = len(op.operands) > 6
        cfg = BackwardConfig(e, ev, bias, ctx.target.vector_bits // 32, ctx.threads,
                             ctx.target.vector_registers)
        return _bound(backward_kernel(cfg, ctx.target), ctx, "fused attention backward",
                      lambda a: (*a[:6], a[6] if bias else None, *a[-3:], scale))


def build(problem: Problem, ctx: Context, decode: bool) -> Kernel:
    # On first use: `import tilefold` does not load the attention generator.
    from tilefold.codegen.llvm.attention import AttentionConfig, DecodeConfig, attention_kernel

    op = problem.body[0]
    attrs = problem.attrs(op)
    q, v = problem.shape(op.operands[0]), problem.shape(op.operands[2])
    mask = "none"
    if len(op.operands) > 3:
        mask = "bool" if str(problem.types[op.operands[3]].dtype) == "bool" else "float"
    scale = _scale(attrs["scale"], q[-1])
    lanes = ctx.target.vector_bits // 32
    if decode:
        cfg = DecodeConfig(q[-1], v[-1], mask, attrs["is_causal"], lanes, ctx.threads,
                           ctx.target.vector_registers)
    else:
        cfg = AttentionConfig(q[-1], v[-1], mask, attrs["is_causal"], lanes, ctx.threads,
                              ctx.target.vector_registers)
    return _bound(attention_kernel(cfg, ctx.target), ctx, "fused attention",
                  lambda a: (*a[:3], a[3] if mask != "none" else None, a[-1], scale))


def _scale(scale: float | None, e: int) -> float:
    """The op's scale, or 1/sqrt(E) (no features: every score is an empty sum, 0, at any
    scale)."""
    if scale is None:
        return 1 / math.sqrt(e) if e else 1.0
    return scale


def _bound(kernel, ctx: Context, what: str, args: Callable[[tuple], tuple]) -> Kernel:
    """The method's kernel calling `kernel(*args(arrays))` on the group's arrays (inputs, then
    outputs), any layout in and out (the kernel copies where it must)."""
    cfg = kernel.cfg

    def run(*arrays: np.ndarray) -> None:
        kernel(*args(arrays))

    def calls(*arrays: np.ndarray):
        return kernel.calls(*args(arrays))

    def asm() -> str:
        return emit_assembly(kernel.source(), ctx.target, opt_level=2)

    return Kernel(run, f"// {what} kernel for {cfg} (LLVM IR: see the assembly)", asm,
                  strided=True, strided_out=True, calls=calls)
