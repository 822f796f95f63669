"""Builds a `CompiledModule` from IR: in-process memo, then the disk cache, then LLVM codegen."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tilefold.runtime import kernel_cache
from tilefold.runtime.codegen import compile_object
from tilefold.runtime.compiled_module import CompiledModule
from tilefold.target import Target
from tilefold.target.machine import LLVM_LOCK

log = logging.getLogger("tilefold.kernels")
_memo: dict[str, CompiledModule] = {}


@dataclass(frozen=True)
class Recipe:
    """How a module's object code is made: its IR generator and codegen options (an exported
    artifact compiles the same IR again, position-independent, into a shared library)."""

    make_ir: Callable[[], str]
    opt_level: int
    strength_reduce: bool
    portable: bool = False  # the IR assumes no CPU feature: any target of its arch may run it


def module_at(address: int) -> tuple[CompiledModule, str] | None:
    """The module built in this process that exports the function at `address`, and the
    symbol's name; None when no module does (a ctypes callback, a library function)."""
    with LLVM_LOCK:
        for module in _memo.values():
            symbol = module.symbol_at(address)
            if symbol is not None:
                return module, symbol
    return None


def build_module(llvm_ir: str, target: Target, *, name: str, opt_level: int = 0) -> CompiledModule:
    """The module for (IR, target, opt level), compiled at most once per machine.

    A disk hit links the cached object directly, so a warm process never runs LLVM codegen.
    """
    key = kernel_cache.cache_key(llvm_ir, target, opt_level)
    return build_module_keyed(key, lambda: llvm_ir, target, name=name, opt_level=opt_level)


def build_module_keyed(
    key: str, make_ir: Callable[[], str], target: Target, *, name: str, opt_level: int = 0,
    strength_reduce: bool = True, portable: bool = False,
) -> CompiledModule:
    """The module cached under `key` (which must cover every argument that shapes the object
    code); `make_ir()` runs only when neither the process memo nor the disk has it (its time
    counts in `compile_seconds`)."""
    with LLVM_LOCK:
        cached = _memo.get(key)
        if cached is not None:
            return cached
        start = time.perf_counter()
        entry = kernel_cache.load(key)
        from_cache = entry is not None
        if entry is None:
            code = compile_object(make_ir(), target, name=name, opt_level=opt_level,
                                  strength_reduce=strength_reduce)
            entry = kernel_cache.CacheEntry(
                name, code.data, code.exports, time.perf_counter() - start
            )
            kernel_cache.store(key, entry, target)
        module = CompiledModule(
            name=name,
            target=target,
            key=key,
            object_code=entry.data,
            exports=entry.exports,
            compile_seconds=time.perf_counter() - start,
            from_cache=from_cache,
            recipe=Recipe(make_ir, opt_level, strength_reduce, portable),
        )
        _memo[key] = module
    if from_cache:
        log.info("kernel %s: loaded from cache in %.2f ms", name, module.compile_seconds * 1e3)
    else:
        log.info(
            "kernel %s: compiled for %s in %.1f ms (%d bytes)",
            name,
            target.name,
            module.compile_seconds * 1e3,
            len(entry.data),
        )
    return module
