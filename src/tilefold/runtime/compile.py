"""`compile_llvm_ir`: the front door for generated code, linking the native runtime on demand."""

from __future__ import annotations

from tilefold.errors import UnsupportedError
from tilefold.runtime.build import build_module
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.runtime.thread_pool import RUNTIME_SYMBOLS, thread_pool
from tilefold.target import Target, enable_amx

# Any of these in a module means it executes AMX tile instructions.
_AMX_MARKERS = ("@llvm.x86.ldtilecfg", "@llvm.x86.tile", "@llvm.x86.tdp", "x86_amx")


def compile_llvm_ir(
    llvm_ir: str, target: Target, *, name: str, opt_level: int = 0
) -> CompiledModule:
    """Compile `llvm_ir` for `target` (cached on disk) and, if it can run here, link it.

    opt_level 0 is backend codegen only (-O3 instruction selection and scheduling), right for
    hand-structured IR; 1-3 first run LLVM's middle-end pipeline at that level. Modules that
    declare `tilefold_parallel`, `tilefold_barrier` or `tilefold_pool_size` start the pool first;
    modules using AMX get the process's AMX permission first.
    """
    if target.is_host():
        if any(f"@{symbol}" in llvm_ir for symbol in RUNTIME_SYMBOLS):
            thread_pool()
        if any(marker in llvm_ir for marker in _AMX_MARKERS) and not enable_amx():
            raise UnsupportedError(
                f"module {name!r} uses AMX, which this process may not use (no amx-tile on "
                f"{target.name}, or the kernel refused); pick a non-AMX micro-kernel"
            )
    return build_module(llvm_ir, target, name=name, opt_level=opt_level)
