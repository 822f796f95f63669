"""The GPU's methods: Triton kernels (`codegen/triton`) and the torch library beside them,
proposed for GPU targets only; their kernels take and return torch tensors on one device.

    triton.memory      a memory group as one Triton kernel (`TritonGroup`)
    triton.gemm        a compute group on the GEMM template with its prologue and epilogue,
                       a candidate per config `propose_configs` gives (with the persistent TMA
                       twin where the call's operands suit tensor descriptors)
    triton.attention   attention on the fused template, a candidate per config
                       `propose_attention_configs` gives
    extern.torch.gpu   the library: prologue views, torch.matmul (cuBLAS) and the epilogue as
                       one Triton kernel over C; torch's scaled_dot_product_attention
    extern.host        any op's NumPy reference on host copies (a round trip; strict mode
                       refuses it)

A GPU chooses per call layout (`Context.arrays`: the tensors); asked without arrays (which
method will run this op, before any call), a template answers with one candidate standing
for its configs. The cost model ranks a template's configs in their proposed order, ahead of
the library, and the host last.
"""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import numpy as np

from tilefold.errors import UnsupportedError, strict
from tilefold.ir.interpreter import run_region
from tilefold.ir.ops import VIEWS
from tilefold.strategy.cost import Work, roofline, work
from tilefold.strategy.method import Candidate, Context, Kernel, Method, register_method
from tilefold.strategy.problem import Problem

GPU = ("gpu",)
ATTENTION = "scaled_dot_product_attention"
RANK_STEP = 0.01  # each later config of a template is estimated this much slower
HOST_LINK_BYTES_S = 25e9  # a host round trip's copies (PCIe 4 x16, each way)
CONFIGS = 4  # a template's configs raced (the cost model's first)


def _ranked(base: float, i: int) -> float:
    return base * (1 + RANK_STEP * i)


def _template_estimate(w: Work, ctx: Context) -> float:
    return roofline(w.flops, w.bytes_fused, ctx.machine, 0.8, 0.8) + ctx.machine.call_s


@register_method
class TritonMemory(Method):
    name = "triton.memory"
    family = "auto-codegen"
    platforms = GPU
    generators = ("tilefold.codegen.triton", "tilefold.codegen.kernel",
                  "tilefold.codegen.backend")

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        from tilefold.codegen.triton.group import TritonGroup

        if problem.kind != "memory":
            return "runs memory groups only"
        op = problem.op
        try:
            group = ctx.platform.made(op, (self.name, ctx.target.name),
                          lambda: TritonGroup(op.regions[0], ctx.target))
        except UnsupportedError as exc:
            return exc.message
        w = work(problem)
        estimate = roofline(w.flops, w.bytes_fused, ctx.machine, 0.7, 0.8) + ctx.machine.call_s
        return [self.candidate({}, estimate, lambda: Kernel(group), "Triton kernel")]


@register_method
class TritonGemm(Method):
    name = "triton.gemm"
    family = "building-blocks"
    platforms = GPU
    generators = ("tilefold.codegen.triton",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        from tilefold.codegen.triton.gemm_config import GemmConfig, propose_configs

        if problem.kind != "compute":
            return "runs compute groups only"
        if not all(v.type.is_static for v in problem.inputs):
            return "the template is planned at static shapes (a symbolic dim is left to the " \
                "library)"
        template = self._group(problem, ctx, "none")
        stand_in = [SimpleNamespace(shape=s) for s in problem.shapes]
        try:  # the plan and the template's source at these shapes (no tensors needed)
            template.plan(*stand_in)
        except UnsupportedError as exc:
            return exc.message
        w = work(problem)
        note = "Triton GEMM template"
        if ctx.arrays is None:
            return [self.candidate({}, _template_estimate(w, ctx), _unbuilt, note)]
        xs = ctx.arrays
        configs = propose_configs(ctx.target, *template.mnk(*xs), template.dot_dtype(*xs),
                                  limit=CONFIGS, tma=template.tma(*xs))

        def build(config: GemmConfig) -> Kernel:
            split = "none" if config.split_k == 1 else "workspace"
            group = self._group(problem, ctx, split)
            group.plan(*xs)  # the template's source for these shapes (Triton compiles on launch)
            return Kernel(lambda *ts: group(*ts, config=config),
                          lambda: group.source(*xs))

        return [self.candidate(asdict(c), _ranked(_template_estimate(w, ctx), i),
                               lambda c=c: build(c), note) for i, c in enumerate(configs)]

    def _group(self, problem: Problem, ctx: Context, split: str):
        from tilefold.codegen.triton.gemm_group import TritonGemmGroup

        op = problem.op
        return ctx.platform.made(op, (self.name, ctx.target.name, split),
                     lambda: TritonGemmGroup(op.regions[0], ctx.target, split))


@register_method
class TritonAttention(Method):
    name = "triton.attention"
    family = "hand-written"
    platforms = GPU
    generators = ("tilefold.codegen.triton",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        from tilefold.codegen.triton.attention_config import (
            AttentionConfig,
            propose_attention_configs,
        )
        from tilefold.codegen.triton.attention_op import TritonAttentionOp

        if reason := problem.not_lone(ATTENTION):
            return reason
        op = problem.op
        try:
            kernel = ctx.platform.made(op, self.name, lambda: TritonAttentionOp(op))
        except UnsupportedError as exc:
            return exc.message
        w = work(problem)
        base = roofline(w.flops, w.bytes_fused, ctx.machine, 0.6, 0.8) + ctx.machine.call_s
        note = "Triton attention template"
        if ctx.arrays is None:
            return [self.candidate({}, base, _unbuilt, note)]
        q, k = problem.shape(problem.inputs[0]), problem.shape(problem.inputs[1])
        configs = propose_attention_configs(ctx.target, q[0] * q[1], q[2], k[2], q[3],
                                            str(problem.types[problem.inputs[0]].dtype),
                                            limit=CONFIGS)

        def build(config: AttentionConfig) -> Kernel:
            return Kernel(lambda *ts: [kernel(*ts, **config.launch())])

        return [self.candidate(asdict(c), _ranked(base, i), lambda c=c: build(c), note)
                for i, c in enumerate(configs)]


@register_method
class TorchGPUExtern(Method):
    name = "extern.torch.gpu"
    family = "extern"
    platforms = GPU
    generators = ("tilefold.codegen.triton",)

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        w = work(problem)
        base = roofline(w.flops, w.bytes_unfused, ctx.machine, 0.75, 0.8)
        if problem.names == (ATTENTION,) and len(problem.inputs) == 3:
            attrs = problem.attrs(problem.op)
            return [self.candidate({}, _ranked(base, CONFIGS) + ctx.machine.call_s,
                                   lambda: Kernel(_sdpa(attrs)), "torch SDPA")]
        if problem.kind != "compute":
            return "runs compute groups (torch.matmul) and attention without a mask (SDPA)"
        try:
            run, note = _matmul_group(problem, ctx)
        except UnsupportedError as exc:
            return exc.message
        launches = 2 if "epilogue" in note else 1
        return [self.candidate({}, _ranked(base, CONFIGS) + launches * ctx.machine.call_s,
                               lambda: Kernel(run), note)]


@register_method
class HostReference(Method):
    name = "extern.host"
    family = "extern"
    platforms = GPU

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate] | str:
        if strict():
            return ("strict mode refuses running the op's NumPy reference on host copies "
                    "(unset TILEFOLD_STRICT to allow the round trip)")
        w = work(problem)
        estimate = w.bytes_fused / HOST_LINK_BYTES_S + w.flops / 5e9 + ctx.machine.numpy_op_s
        op, attrs = problem.op, problem.op.opdef.full_attrs(problem.op.attrs)

        def run(*xs: Any) -> list[Any]:
            device = xs[0].device if xs else None
            out = op.opdef.reference_op([to_host(x) for x in xs], attrs, op.regions,
                                        run_region)
            outs = list(out) if len(op.results) > 1 else [out]
            return [to_device(np.asarray(o), device) for o in outs]

        return [self.candidate({}, estimate, lambda: Kernel(run), "host NumPy reference")]


def _unbuilt() -> Kernel:
    raise UnsupportedError("a template's stand-in for its configs (proposed without the "
                           "call's tensors) is not built: decide again with them")


def _matmul_group(problem: Problem, ctx: Context):
    """Prologue views, torch.matmul, and the epilogue as one Triton kernel over C: the run
    and what it is, or `UnsupportedError` saying why not."""
    from tilefold.codegen.triton.gemm_group import epilogue_block
    from tilefold.codegen.triton.group import TritonGroup

    region = problem.op.regions[0]
    body = list(problem.body)
    matmuls = [o for o in body if o.name == "matmul"]
    if len(matmuls) != 1 or any(o.name not in VIEWS for o in body[:body.index(matmuls[0])]):
        raise UnsupportedError("a compute group needs one matmul after view prologues")
    mm = matmuls[0]
    at = body.index(mm)
    if not all(v.type.dtype.is_float for v in mm.operands):
        raise UnsupportedError(f"torch.matmul on a GPU takes floats, not "
                               f"{mm.operands[0].type.dtype}")
    prologue, epilogue = body[:at], body[at + 1:]
    yielded = region.terminator.operands
    epi = epilogue_block(mm.results[0], epilogue, yielded) if epilogue else None
    kernel = None
    if epi is not None:
        try:
            kernel = ctx.platform.made(problem.op, ("extern.epilogue", ctx.target.name),
                           lambda: TritonGroup(epi[0], ctx.target))
        except UnsupportedError as exc:
            raise UnsupportedError(f"epilogue: {exc.message}") from exc
    attrs = mm.opdef.full_attrs(mm.attrs)

    def run(*xs: Any) -> list[Any]:
        import torch

        env = dict(zip(region.args, xs, strict=True))
        for p in prologue:
            env[p.results[0]] = VIEWS[p.name](env[p.operands[0]], p.opdef.full_attrs(p.attrs))
        a, b = (env[v] for v in mm.operands)
        if attrs["transpose_a"] and a.dim() >= 2:
            a = a.transpose(-1, -2)
        if attrs["transpose_b"] and b.dim() >= 2:
            b = b.transpose(-1, -2)
        env[mm.results[0]] = torch.matmul(a, b)
        if kernel is not None:
            _, ins, outs = epi
            env.update(zip(outs, kernel(*[env[v] for v in ins]), strict=True))
        return [env[v] for v in yielded]

    return run, "torch.matmul" + (" + Triton epilogue" if kernel is not None else "")


def _sdpa(attrs: dict):
    """torch's scaled_dot_product_attention with the IR op's attributes, on q, k, v."""
    def run(*xs: Any) -> list[Any]:
        import torch

        return [torch.nn.functional.scaled_dot_product_attention(
            *xs[:3], is_causal=attrs["is_causal"], scale=attrs["scale"],
            enable_gqa=attrs["enable_gqa"])]

    return run


def to_host(x: Any) -> np.ndarray:
    """A torch tensor as a NumPy array on the host (bf16 as ml_dtypes' bfloat16)."""
    import torch

    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.detach().cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.detach().cpu().numpy()


def to_device(a: np.ndarray, device: Any) -> Any:
    """A NumPy array as a torch tensor on `device` (None: the host); 0-d stays 0-d."""
    import torch

    a = np.asarray(a, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t.to(device) if device is not None else t
