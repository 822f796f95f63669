"""Compiles and runs a probe in this process: the target layer's own minimal JIT.

Kernels go through `tilefold.runtime` (cache, linking, thread pool); probes are a few small,
self-contained modules per machine, so an MCJIT engine each is enough.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import llvmlite.binding as llvm

from tilefold.errors import CompileError, UnsupportedError
from tilefold.target.machine import LLVM_LOCK, parse_for_target, target_machine
from tilefold.target.target import Target

_engines: list[llvm.ExecutionEngine] = []  # probe code stays valid for the process


def probe_function(
    llvm_ir: str, target: Target, symbol: str, restype: Any, *argtypes: Any
) -> Callable[..., Any]:
    """A ctypes function for `symbol` in `llvm_ir`, compiled for `target` (which must be here)."""
    if not target.is_host():
        raise UnsupportedError(
            f"cannot measure {target.name} on this machine: its code cannot run here"
        )
    with LLVM_LOCK:
        machine = target_machine(target, jit=True)
        try:
            module = parse_for_target(llvm_ir, target, machine)
        except RuntimeError as exc:
            raise CompileError(f"probe IR for {target.name} is invalid: {exc}") from exc
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        _engines.append(engine)
        address = engine.get_function_address(symbol)
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)
