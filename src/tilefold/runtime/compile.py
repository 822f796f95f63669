"""`compile_llvm_ir`: the front door for generated code, linking the native runtime on demand."""

from __future__ import annotations

from collections.abc import Callable

from tilefold.errors import UnsupportedError
from tilefold.runtime import kernel_cache
from tilefold.runtime.build import build_module, build_module_keyed
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.runtime.thread_pool import RUNTIME_SYMBOLS, thread_pool
from tilefold.target import Target, enable_amx

# A global named with any of these prefixes means a module executes AMX tile instructions.
_AMX_PREFIXES = ("llvm.x86.ldtilecfg", "llvm.x86.tile", "llvm.x86.tdp")


def _mentions(llvm_ir: str, prefix: str) -> bool:
    """Whether `llvm_ir` names a global starting with `prefix`, quoted or not.

    llvmlite's IR builder quotes every name (`@"tilefold_parallel"`); hand-written IR does not.
    """
    return f"@{prefix}" in llvm_ir or f'@"{prefix}' in llvm_ir


def _require_amx(target: Target, name: str) -> None:
    if not enable_amx():
        raise UnsupportedError(
            f"module {name!r} uses AMX, which this process may not use (no amx-tile on "
            f"{target.name}, or the kernel refused); pick a non-AMX micro-kernel"
        )


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
        if any(_mentions(llvm_ir, symbol) for symbol in RUNTIME_SYMBOLS):
            thread_pool()
        uses_amx = "x86_amx" in llvm_ir or any(_mentions(llvm_ir, p) for p in _AMX_PREFIXES)
        if uses_amx:
            _require_amx(target, name)
    return build_module(llvm_ir, target, name=name, opt_level=opt_level)


def compile_generated(
    fingerprint: str,
    make_ir: Callable[[], str],
    target: Target,
    *,
    name: str,
    uses_pool: bool = False,
    uses_amx: bool = False,
    opt_level: int = 0,
    strength_reduce: bool = True,
    portable: bool = False,
) -> CompiledModule:
    """`compile_llvm_ir` for generated code, cached under `fingerprint` (the generator's source
    and parameters) instead of the IR text: a warm process never even builds the IR, which for
    large generated modules costs more than loading the object. `make_ir()` runs on a miss only.

    The caller vouches that the fingerprint changes whenever the IR would, and says whether the
    module calls the native pool (`uses_pool`) or executes AMX instructions (`uses_amx`).
    `strength_reduce=False` compiles without LLVM's loop strength reduction (see
    `compile_object`), for generators whose loops step their own pointers. `portable`: the IR
    assumes no CPU feature (integer moves, `memcpy`), so an exported artifact compiles it for
    its own target, whatever target it runs on here.
    """
    if target.is_host():
        if uses_pool:
            thread_pool()
        if uses_amx:
            _require_amx(target, name)
    if not strength_reduce:
        fingerprint += "\0no-lsr"
    key = kernel_cache.source_key(fingerprint, target, opt_level)
    return build_module_keyed(key, make_ir, target, name=name, opt_level=opt_level,
                              strength_reduce=strength_reduce, portable=portable)
