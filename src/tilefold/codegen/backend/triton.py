"""The Triton backend for GPUs: kernel IR + GPU schedule -> Triton source
(`codegen/triton/emit.py`) -> a launcher over torch tensors (`codegen/triton/launch.py`).

Emitting source needs no Triton; compiling and running do (the `triton` extra). The entry it
returns is a `TritonLaunch`: `entry(tensors, sizes, strides)`, one torch tensor per kernel
buffer, on a CUDA device or on the CPU under TRITON_INTERPRET=1. Compute groups (a matmul
and its epilogue) take the GEMM template instead (`gemm_spec`, `gemm`:
`codegen/triton/gemm*.py`), since the kernel IR holds no contraction, and attention ops the
attention template (`attention`: `codegen/triton/attention*.py`).
"""

from __future__ import annotations

from typing import Any

from tilefold.codegen.backend.base import Backend, Executable, register_backend
from tilefold.codegen.kernel.ir import DTYPES, Call, Kernel, walk_expr
from tilefold.codegen.triton.emit import emit_triton, kernel_expressions
from tilefold.codegen.triton.math import PRIMITIVE_FORMS
from tilefold.codegen.triton.schedule import GPUSchedule, choose_gpu_schedule, shape_problem
from tilefold.errors import UnsupportedError
from tilefold.runtime import source_digest
from tilefold.target.gpu import GPUTarget

GENERATORS = ("tilefold.codegen.triton", "tilefold.codegen.backend")


def _schedule(kernel: Kernel, schedule: Any, target: GPUTarget) -> GPUSchedule:
    return schedule if isinstance(schedule, GPUSchedule) else choose_gpu_schedule(kernel, target)


@register_backend
class TritonBackend(Backend):
    name = "triton"

    def supports(self, kernel: Kernel, target: Any) -> str | None:
        if not isinstance(target, GPUTarget):
            return f"the Triton backend generates GPU code; {target.name} is not a GPU target"
        if target.vendor != "nvidia":
            return (f"the Triton backend is checked on NVIDIA GPUs only; {target.name} is "
                    f"{target.vendor}")
        other = sorted({b.dtype for b in kernel.buffers} - set(DTYPES))
        if other:
            return (f"the Triton backend loads and stores {', '.join(DTYPES)}, "
                    f"not {', '.join(other)}")
        missing = sorted({e.op for x in kernel_expressions(kernel) for e in walk_expr(x)
                          if isinstance(e, Call) and e.op not in PRIMITIVE_FORMS})
        if missing:
            return f"the Triton backend has no form for {', '.join(missing)} yet"
        problem = shape_problem(kernel)
        if problem is not None:
            return f"the Triton backend runs rows of column passes; this kernel: {problem}"
        return None

    def fingerprint(self) -> str:
        return f"{self.name}:{source_digest(*GENERATORS)}"

    def source(self, kernel: Kernel, schedule: Any, target: GPUTarget) -> str:
        """The Triton source `compile` runs."""
        return emit_triton(kernel, _schedule(kernel, schedule, target))

    def compile(self, kernel: Kernel, schedule: Any, target: GPUTarget) -> Executable:
        from tilefold.codegen.triton.launch import TritonLaunch, load_jit

        sched = _schedule(kernel, schedule, target)
        text = emit_triton(kernel, sched)
        return Executable(TritonLaunch(kernel, sched, load_jit(text, kernel.name)),
                          lambda: text)

    def assembly(self, kernel: Kernel, schedule: Any, target: GPUTarget) -> str:
        from tilefold.codegen.triton.ptx import compile_ptx

        return compile_ptx(kernel, _schedule(kernel, schedule, target), target).ptx

    # --- compute groups: one matmul and its epilogue, as the GEMM template -------------
    def gemm_template(self, group: Any, target: GPUTarget,
                      bindings: dict[str, int]) -> tuple[Any, Any]:
        """The GEMM template's plan and spec for a compute group (a `fused` region or a
        function) at these symbolic dim sizes, as compiled code runs it (`UnsupportedError`
        says why the template cannot take the group)."""
        from tilefold.codegen.triton.gemm import GemmSpec
        from tilefold.codegen.triton.gemm_group import plan_gemm

        if not isinstance(target, GPUTarget) or target.vendor != "nvidia":
            raise UnsupportedError(f"the Triton GEMM template is for NVIDIA GPU targets, not "
                                   f"{target.name}")
        plan = plan_gemm(group, bindings)
        dtype = str(plan.matmul.operands[0].type.dtype)
        return plan, GemmSpec(dtype, dtype, plan.program, plan.stores, plan.c_round)

    def gemm(self, group: Any, target: GPUTarget, split: str = "none") -> Any:
        """A compute group as the GEMM template, called on torch tensors (`TritonGemmGroup`)."""
        from tilefold.codegen.triton.gemm_group import TritonGemmGroup

        return TritonGemmGroup(group, target, split)

    # --- scaled_dot_product_attention, as the attention template -----------------------
    def attention_spec(self, op: Any, target: GPUTarget) -> Any:
        """The attention template's spec for a `scaled_dot_product_attention` op, as compiled
        code runs it (`UnsupportedError` says why the template cannot take the op)."""
        from tilefold.codegen.triton.attention_op import attention_spec

        if not isinstance(target, GPUTarget) or target.vendor != "nvidia":
            raise UnsupportedError(f"the Triton attention template is for NVIDIA GPU targets, "
                                   f"not {target.name}")
        return attention_spec(op)

    def attention(self, op: Any, target: GPUTarget) -> Any:
        """A `scaled_dot_product_attention` op as the attention template, called on torch
        tensors."""
        from tilefold.codegen.triton.attention_op import TritonAttentionOp

        self.attention_spec(op, target)
        return TritonAttentionOp(op)
