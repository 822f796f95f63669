"""bf16/f16 GEMMs of widening registry entries: the f32 GEMM on operands widened while packed."""

from __future__ import annotations

import numpy as np

from tilefold.codegen.llvm.gemm.module import GemmModule, gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.lowp.kernels import DotKernel
from tilefold.runtime.thread_pool import thread_pool
from tilefold.target import Target

_plans: dict[tuple, object] = {}
_MAX_PLANS = 256


def widened_module(kernel: DotKernel, target: Target) -> GemmModule:
    """The f32 GEMM module of `target` whose packing widens `kernel.dtype` operands."""
    return gemm_module(target, None, kernel.dtype)


def prepack_widened(b: np.ndarray, kernel: DotKernel, target: Target) -> PackedMatrix:
    """B[K, N] of bf16/f16 packed once into the f32 GEMM's panels (widened: f32 panels)."""
    return PackedMatrix(b, widened_module(kernel, target))


def run_widened(a: np.ndarray, b: np.ndarray | PackedMatrix, kernel: DotKernel, target: Target,
                threads: int | None) -> np.ndarray:
    """C = A[M, K] @ B[K, N] in f32 (B raw, any strides, or `prepack_widened`'s panels)."""
    module = widened_module(kernel, target)
    m, k = a.shape
    n = b.shape[1]
    c = np.empty((m, n), np.float32)
    if c.size == 0 or k == 0:
        c[...] = 0
        return c
    threads = threads or thread_pool().size
    if not isinstance(b, PackedMatrix) and not b.flags.aligned:
        b = np.ascontiguousarray(b)
    packed = isinstance(b, PackedMatrix)
    # A plan holds shapes and strides, never data: pre-packed B of one shape share one.
    key = (module.src, target, a.dtype, a.shape, a.strides, b.shape,
           "packed" if packed else (b.dtype, b.strides), threads)
    plan = _plans.get(key)
    if plan is None:
        plan = make_plan(module, a, b, c, 0, threads)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    plan(a, b.data if packed else b, c)
    return c
