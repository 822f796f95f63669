"""Runs compiled code: the JIT and its on-disk kernel cache, and the native parallel runtime.

Names are imported on first use: `runtime.buffers` and `runtime.numpy_threads` serve processes
that build weights or run saved artifacts without loading LLVM. The pool itself is
`runtime.thread_pool.thread_pool()` (a name that is also its module's).
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "codegen_runs": "codegen", "emit_assembly": "codegen", "emit_object": "codegen",
    "compile_generated": "compile", "compile_llvm_ir": "compile",
    "CompiledModule": "compiled_module", "source_digest": "kernel_cache",
    "RegionCost": "thread_pool", "ThreadPool": "thread_pool", "num_threads": "thread_pool",
    "cache_dir": "paths",
}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module 'tilefold.runtime' has no attribute {name!r}")
    package = "tilefold.target" if name == "cache_dir" else "tilefold.runtime"
    value = getattr(importlib.import_module(f"{package}.{_FROM[name]}"), name)
    globals()[name] = value
    return value
