"""`tilefold.compile(module, target="h200")`: the fused graph run on torch tensors of one GPU.

The same passes and fusion as the CPU path, then per op of the function:

    fused memory group    one Triton kernel (`codegen/triton`, `TritonGroup`)
    fused compute group   the GEMM template with its prologue and epilogue (`TritonGemmGroup`)
                          at the config `strategy.gpu_tuner` chooses (the cost model's first,
                          the tuning database's winner, or under TILEFOLD_TUNE the fastest
                          measured, the extern below included); where it refuses, the
                          extern: the prologue as torch views, the GEMM on `torch.matmul`
                          (cuBLAS) and the epilogue over C as one Triton kernel
    attention             the fused-attention template (`TritonAttentionOp`) at the config the
                          tuner chooses, torch's SDPA the extern beside it
    view op               a torch view (reshape, transpose, expand/squeeze, broadcast, slice)
    anything else         the op's NumPy reference on host copies: a round trip that
                          `GPUGraph.report()` names and strict mode refuses (FallbackError)

Under `TRITON_INTERPRET=1` the kernels run on CPU tensors, so whole graphs are checked without a
GPU (tests/gpu). Plans are made per input signature: the Triton kernels compile once per layout,
and constants are copied to the inputs' device once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from tilefold.codegen.triton.attention_op import OP, TritonAttentionOp
from tilefold.codegen.triton.gemm_config import GemmConfig
from tilefold.codegen.triton.gemm_group import TritonGemmGroup
from tilefold.codegen.triton.group import TritonGroup
from tilefold.errors import FallbackError, TilefoldError, UnsupportedError, strict, strict_mode
from tilefold.ir import OPS, Block, Module, Operation, Value
from tilefold.ir.interpreter import run_region
from tilefold.ir.ops import VIEWS  # layout ops as torch views
from tilefold.ir.types import TensorType
from tilefold.strategy.gpu_tuner import (
    GPUCandidate,
    GPUChoice,
    GPUTuner,
    attention_candidates,
    gemm_candidates,
)
from tilefold.strategy.problem import Problem
from tilefold.target.gpu import GPUTarget


@dataclass
class _Step:
    """How one op of the function runs: `how` for the report, `run(tensors) -> tensors`."""

    op: Operation
    how: str
    run: Callable[[list[Any]], list[Any]]


@dataclass
class GPUGraph:
    """A compiled function for a GPU target: call it with torch tensors on one device (CPU ones
    under Triton's interpreter); it returns a list of tensors there, one per result."""

    module: Module
    function: str
    target: GPUTarget
    strict: bool | None = None
    tuner: GPUTuner | None = None  # None: one with TILEFOLD_TUNE's budget and do_bench
    steps: list[_Step] = field(default_factory=list)
    _constants: dict[tuple[int, str], Any] = field(default_factory=dict)
    _device: Any = None

    def __post_init__(self) -> None:
        self.tuner = self.tuner or GPUTuner(self.target)
        with strict_mode(self.strict):
            fn = self.module[self.function]
            self.steps = [self._step(op) for op in fn.ops if op.name != "return"]

    def report(self) -> list[str]:
        """One line per op: how it runs on the GPU (`explain` for this target)."""
        return [f"%{s.op.results[0].name if s.op.results else '?'} = {s.op.name}: {s.how}"
                for s in self.steps]

    def __call__(self, *tensors: Any) -> list[Any]:
        fn = self.module[self.function]
        if len(tensors) != len(fn.args):
            raise TilefoldError(f"@{fn.name} takes {len(fn.args)} inputs, got {len(tensors)}")
        env: dict[Value, Any] = dict(zip(fn.args, tensors, strict=True))
        self._device = tensors[0].device if tensors else None
        for step in self.steps:
            outs = step.run([env[v] for v in step.op.operands])
            env.update(zip(step.op.results, outs, strict=True))
        return [env[v] for v in fn.return_op.operands]

    def _step(self, op: Operation) -> _Step:
        if op.name in VIEWS:
            view, attrs = VIEWS[op.name], op.opdef.full_attrs(op.attrs)
            return _Step(op, "torch view", lambda xs: [view(xs[0], attrs)])
        if op.name == "constant":
            return _Step(op, "constant", lambda xs: [self._constant(op)])
        if op.name == "fused" and op.attrs.get("kind", "memory") == "memory":
            return self._memory_group(op)
        if op.name == "fused":
            return self._gemm_group(op)
        if op.name == OP:
            return self._attention(op)
        return self._host_step(op, f"'{op.name}' has no GPU lowering")

    def _constant(self, op: Operation) -> Any:
        """`op`'s value as a tensor on the device of this call's inputs (copied there once)."""
        key = (id(op), str(self._device))
        if key not in self._constants:
            self._constants[key] = _to_device(op.attrs["value"], self._device)
        return self._constants[key]

    def _gemm_group(self, op: Operation) -> _Step:
        """The template at a tuned config with the extern beside it, or the extern alone."""
        template = self._template_group(op)
        extern = self._compute_group(op)
        if template is None:
            return extern if isinstance(extern, _Step) else self._host_step(op, extern)
        candidates = _GemmCandidates(op, self.target, template,
                                     extern if isinstance(extern, _Step) else None)
        return _Tuned(op, self.tuner, "Triton GEMM template", candidates, candidates.how).step

    def _template_group(self, op: Operation) -> TritonGemmGroup | None:
        """The GEMM template, when it takes the group at its (static) shapes."""
        region = op.regions[0]
        if not all(v.type.is_static for v in region.args):
            return None
        group = TritonGemmGroup(region, self.target)
        try:  # the plan and the template's source at the static shapes (no tensors needed)
            group.plan(*[SimpleNamespace(shape=tuple(v.type.shape)) for v in region.args])
        except UnsupportedError:
            return None
        return group

    def _attention(self, op: Operation) -> _Step:
        """The attention template at a tuned config, with torch's SDPA as the extern."""
        try:
            kernel = TritonAttentionOp(op)
        except UnsupportedError as exc:
            return self._host_step(op, str(exc))
        dtype = str(op.operands[0].type.dtype)

        def candidates(xs: list[Any]) -> list[GPUCandidate]:
            return attention_candidates(
                self.target, xs[0], xs[1], dtype,
                lambda config: lambda ts: [kernel(*ts, **config.launch())],
                _sdpa(op.opdef.full_attrs(op.attrs)))

        how = "Triton attention template"
        return _Tuned(op, self.tuner, how, candidates,
                      lambda key: how if key.startswith("triton.") else "torch SDPA").step

    def _memory_group(self, op: Operation) -> _Step:
        try:
            group = TritonGroup(op.regions[0], self.target)
        except UnsupportedError as exc:
            return self._host_step(op, str(exc))
        return _Step(op, "Triton kernel", lambda xs: group(*xs))

    def _compute_group(self, op: Operation) -> _Step | str:
        """Prologue views, torch.matmul, and the epilogue as one Triton kernel over C (or why
        not)."""
        region = op.regions[0]
        body = [o for o in region.ops if o.name != "yield"]
        matmuls = [o for o in body if o.name == "matmul"]
        if len(matmuls) != 1 or any(o.name not in VIEWS for o in body[:body.index(matmuls[0])]):
            return "a compute group needs one matmul after view prologues"
        mm = matmuls[0]
        at = body.index(mm)
        if not all(v.type.dtype.is_float for v in mm.operands):
            return f"torch.matmul on a GPU takes floats, not {mm.operands[0].type.dtype}"
        prologue, epilogue = body[:at], body[at + 1:]
        yielded = region.terminator.operands
        epi = _epilogue_block(mm.results[0], epilogue, yielded) if epilogue else None
        kernel = None
        if epi is not None:
            try:
                kernel = TritonGroup(epi[0], self.target)
            except UnsupportedError as exc:
                return f"epilogue: {exc}"
        attrs = mm.opdef.full_attrs(mm.attrs)

        def run(xs: list[Any]) -> list[Any]:
            env = dict(zip(region.args, xs, strict=True))
            for p in prologue:
                env[p.results[0]] = VIEWS[p.name](env[p.operands[0]],
                                                  p.opdef.full_attrs(p.attrs))
            a, b = (env[v] for v in mm.operands)
            if attrs["transpose_a"] and a.dim() >= 2:
                a = a.transpose(-1, -2)
            if attrs["transpose_b"] and b.dim() >= 2:
                b = b.transpose(-1, -2)
            env[mm.results[0]] = _matmul(a, b)
            if kernel is not None:
                _, ins, outs = epi
                results = kernel(*[env[v] for v in ins])
                env.update(zip(outs, results, strict=True))
            return [env[v] for v in yielded]

        how = "torch.matmul" + (" + Triton epilogue" if kernel is not None else "")
        return _Step(op, how, run)

    def _host_step(self, op: Operation, why: str) -> _Step:
        if strict():
            raise FallbackError(f"{op.name}: {why}; on {self.target.name} it would run its "
                                "NumPy reference on host copies (strict mode forbids it)")
        attrs = op.opdef.full_attrs(op.attrs)

        def run(xs: list[Any]) -> list[Any]:
            device = xs[0].device if xs else None
            arrays = [_to_host(x) for x in xs]
            out = op.opdef.reference_op(arrays, attrs, op.regions, run_region)
            outs = list(out) if len(op.results) > 1 else [out]
            return [_to_device(np.asarray(o), device) for o in outs]

        return _Step(op, f"host NumPy reference ({why})", run)


class _Tuned:
    """An op run by the candidate the tuner chooses per input layout among `candidates(xs)`
    (a template's configs and its extern); `hows(key)` says what a candidate is, and `step`
    reports the choice once one is made."""

    def __init__(self, op: Operation, tuner: GPUTuner, how: str,
                 candidates: Callable[[list[Any]], list[GPUCandidate]],
                 hows: Callable[[str], str]):
        self.op, self.tuner, self.candidates, self.hows = op, tuner, candidates, hows
        self.chosen: dict[tuple, GPUChoice] = {}
        self.step = _Step(op, how, self)

    def __call__(self, xs: list[Any]) -> list[Any]:
        key = tuple((tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device)) for x in xs)
        choice = self.chosen.get(key)
        if choice is None:
            signature = Problem.of(self.op, [tuple(x.shape) for x in xs]).signature
            choice = self.chosen[key] = self.tuner.choose(signature, xs, self.candidates(xs))
            self.step.how = f"{self.hows(choice.key)} ({choice.key}: {choice.why})"
        return choice.run(xs)


class _GemmCandidates:
    """A compute group's candidates: the GEMM template at each proposed config (split-K ones on
    a workspace template), and the extern (`torch.matmul` + the Triton epilogue) if any."""

    def __init__(self, op: Operation, target: GPUTarget, template: TritonGemmGroup,
                 extern: _Step | None):
        self.op, self.target, self.extern = op, target, extern
        self.groups = {"none": template}

    def _template(self, xs: list[Any], config: GemmConfig):
        split = "none" if config.split_k == 1 else "workspace"
        if split not in self.groups:
            self.groups[split] = TritonGemmGroup(self.op.regions[0], self.target, split)
        group = self.groups[split]
        group.plan(*xs)  # the template's source for these shapes (Triton compiles on launch)
        return lambda ts: group(*ts, config=config)

    def __call__(self, xs: list[Any]) -> list[GPUCandidate]:
        template = self.groups["none"]
        return gemm_candidates(self.target, template.mnk(*xs), template.dot_dtype(*xs),
                               lambda config: self._template(xs, config),
                               self.extern.run if self.extern is not None else None,
                               tma=template.tma(*xs))

    def how(self, key: str) -> str:
        return "Triton GEMM template" if self.extern is None or key.startswith("triton.") \
            else self.extern.how


def _sdpa(attrs: dict):
    """torch's scaled_dot_product_attention with the IR op's attributes, on [q, k, v]."""
    def run(xs: list[Any]) -> list[Any]:
        import torch

        return [torch.nn.functional.scaled_dot_product_attention(
            *xs[:3], is_causal=attrs["is_causal"], scale=attrs["scale"],
            enable_gqa=attrs["enable_gqa"])]

    return run


def _matmul(a, b):
    import torch

    return torch.matmul(a, b)


def _to_host(x) -> np.ndarray:
    import torch

    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.detach().cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.detach().cpu().numpy()


def _to_device(a: np.ndarray, device):
    import torch

    a = np.asarray(a, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t.to(device) if device is not None else t


def _epilogue_block(c: Value, ops: Sequence[Operation], yielded: Sequence[Value]
                    ) -> tuple[Block, list[Value], list[Value]]:
    """A region computing the epilogue `ops` from C and their other inputs: (block, the
    outer values its arguments stand for, the outer values it yields)."""
    made = {r for o in ops for r in o.results}
    ins = [c, *dict.fromkeys(v for o in ops for v in o.operands if v not in made and v is not c)]
    block = Block([Value(TensorType(v.type.shape, v.type.dtype), f"a{i}", None, i)
                   for i, v in enumerate(ins)])
    remap = dict(zip(ins, block.args, strict=True))
    for o in ops:
        clone = Operation(o.opdef, [remap[v] for v in o.operands], o.attrs,
                          [r.type for r in o.results], [r.name for r in o.results])
        block.append(clone)
        remap.update(zip(o.results, clone.results, strict=True))
    outs = [v for v in yielded if v in made]
    block.append(Operation(OPS["yield"], [remap[v] for v in outs], {}, [], []))
    return block, ins, outs
