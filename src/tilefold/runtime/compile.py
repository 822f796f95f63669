"""`compile_llvm_ir`: the front door for generated code, linking the native runtime on demand."""

from __future__ import annotations

from tilefold.runtime.build import build_module
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.runtime.thread_pool import RUNTIME_SYMBOLS, thread_pool
from tilefold.target import Target


def compile_llvm_ir(
    llvm_ir: str, target: Target, *, name: str, opt_level: int = 0
) -> CompiledModule:
    """Compile `llvm_ir` for `target` (cached on disk) and, if it can run here, link it.

    opt_level 0 is backend codegen only (-O3 instruction selection and scheduling), right for
    hand-structured IR; 1-3 first run LLVM's middle-end pipeline at that level. Modules that
    declare `tilefold_parallel`, `tilefold_barrier` or `tilefold_pool_size` start the pool first.
    """
    if target.is_host() and any(f"@{symbol}" in llvm_ir for symbol in RUNTIME_SYMBOLS):
        thread_pool()
    return build_module(llvm_ir, target, name=name, opt_level=opt_level)
