"""Builds, compiles (through the runtime's disk cache) and loads the GEMM module for a target."""

from __future__ import annotations

import ctypes
import functools
import logging

from llvmlite import ir

from tilefold.codegen.gemm.driver import ENTRY, PACK_B, emit_gemm
from tilefold.codegen.gemm.gemv import GEMV_ENTRY, emit_gemv
from tilefold.codegen.gemm.registry import MicroKernel, select_microkernel
from tilefold.runtime import compile_llvm_ir, thread_pool
from tilefold.target import host_target

log = logging.getLogger("tilefold.kernels")
_P = ctypes.c_void_p


def gemm_ir(target, kernel: MicroKernel) -> str:
    """The LLVM IR text of the GEMM module for `kernel` on `target`."""
    module = ir.Module(name=f"tf_gemm_{kernel.name}")
    module.triple = target.triple
    emit_gemm(module, kernel)
    emit_gemv(module, kernel.lanes)
    return str(module)


class GemmModule:
    """A compiled GEMM module and the ctypes entry point `fn(params, A, B, C, ws)`."""

    def __init__(self, target, kernel: MicroKernel):
        self.target = target
        self.kernel = kernel
        if target.is_host():
            thread_pool()  # provides `tilefold_parallel` (llvmlite quotes the name in the IR)
        self.compiled = compile_llvm_ir(gemm_ir(target, kernel), target,
                                                name=f"gemm_{kernel.name}")
        self.entry = self.compiled.function(ENTRY, None, _P, _P, _P, _P, _P)
        obj = ctypes.py_object
        self.entry_objects = self.compiled.function(ENTRY, None, _P, obj, obj, obj, _P)
        self.gemv = self.compiled.function(GEMV_ENTRY, None, _P, _P, _P, _P, _P)
        self.gemv_objects = self.compiled.function(GEMV_ENTRY, None, _P, obj, obj, obj, _P)
        i64 = ctypes.c_int64
        self.pack_b = self.compiled.function(PACK_B, None, i64, i64, _P, i64, i64, _P)
        log.info("gemm module %s for %s: %.1f ms%s", kernel.name, target.name,
                 self.compiled.compile_seconds * 1e3,
                 " (from cache)" if self.compiled.from_cache else "")


@functools.cache
def gemm_module(target=None, kernel: MicroKernel | None = None) -> GemmModule:
    """The (process-wide, cached) GEMM module for `target` (default: the host)."""
    target = target or host_target()
    return GemmModule(target, kernel or select_microkernel(target))
