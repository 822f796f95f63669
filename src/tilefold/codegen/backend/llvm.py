"""The LLVM backend for CPUs: kernel IR + schedule -> LLVM IR (`codegen/llvm/kernel.py`) ->
native code through llvmlite's JIT and the on-disk object cache.

The entry it returns is `NAME.arrays(obj0, ..., objN, i64* params, i32 nthreads)`: the
buffers are NumPy array objects (their `id`), whose data pointers the native code reads at
`runtime.arrays.DATA_OFFSET`, so one call is one ctypes dispatch; `multi` is `NAME.multi(i64* table,
i64 entries, i32 nthreads)`, the same kernel over a table of tensors (`emit._emit_multi`).
"""

from __future__ import annotations

import ctypes
from typing import Any

from tilefold.codegen.backend.base import Backend, Executable, register_backend
from tilefold.codegen.kernel.ir import DTYPES, Kernel
from tilefold.codegen.kernel.printer import print_kernel
from tilefold.codegen.kernel.schedule import Schedule
from tilefold.codegen.llvm.kernel import emit_kernel
from tilefold.runtime import compile_generated, emit_assembly, source_digest
from tilefold.runtime.arrays import DATA_OFFSET
from tilefold.target import Target

OPT_LEVEL = 2  # loop-invariant address arithmetic and SROA of the accumulators need the pipeline
# The code that turns a kernel and schedule into LLVM IR (part of each kernel's cache key).
GENERATORS = ("tilefold.codegen.kernel", "tilefold.codegen.llvm", "tilefold.codegen.llvm.vecmath",
              "tilefold.codegen.backend")


if DATA_OFFSET < 0:
    raise RuntimeError("cannot find the data pointer in a NumPy array object")


@register_backend
class LLVMBackend(Backend):
    name = "llvm"

    def supports(self, kernel: Kernel, target: Any) -> str | None:
        if not isinstance(target, Target):
            return (f"the LLVM backend generates CPU code; {target.name} is not a CPU target "
                    "(a GPU needs a GPU backend)")
        other = sorted({b.dtype for b in kernel.buffers} - set(DTYPES))
        if other:
            return f"the LLVM backend loads and stores {', '.join(DTYPES)}, not {', '.join(other)}"
        return None

    def fingerprint(self) -> str:
        return f"{self.name}:{source_digest(*GENERATORS)}:{DATA_OFFSET}"

    def _emit(self, kernel: Kernel, schedule: Schedule, target: Target) -> str:
        return emit_kernel(kernel, schedule, target.features, DATA_OFFSET)

    def compile(self, kernel: Kernel, schedule: Schedule, target: Target) -> Executable:
        # The printed kernel and schedule determine the LLVM IR: a warm cache skips emitting.
        fingerprint = f"{self.fingerprint()}|{print_kernel(kernel)}|{schedule!r}"
        module = compile_generated(
            fingerprint, lambda: self._emit(kernel, schedule, target), target, name=kernel.name,
            uses_pool=schedule.parallel_axis is not None, opt_level=OPT_LEVEL)
        entry = module.function(f"{kernel.name}.arrays", None,
                                *[ctypes.c_void_p] * (len(kernel.buffers) + 1), ctypes.c_int32)
        multi = module.function(f"{kernel.name}.multi", None, ctypes.c_void_p, ctypes.c_int64,
                                ctypes.c_int32)
        return Executable(entry, lambda: self._emit(kernel, schedule, target), multi)

    def assembly(self, kernel: Kernel, schedule: Schedule, target: Target) -> str:
        return emit_assembly(self._emit(kernel, schedule, target), target, opt_level=OPT_LEVEL)
