"""The process-wide JIT: links object code into the running process, one namespace per module."""

from __future__ import annotations

import functools
import itertools

import llvmlite.binding as llvm

from tilefold.errors import CompileError
from tilefold.target import host_target, target_machine
from tilefold.target.machine import LLVM_LOCK

_runtime_symbols: dict[str, int] = {}
_library_ids = itertools.count()


def register_runtime_symbol(name: str, address: int) -> None:
    """Make a native symbol (e.g. `tilefold_parallel`) resolvable by every module loaded later.

    It is also added to LLVM's process-wide table for code that uses its own MCJIT engine.
    """
    _runtime_symbols[name] = address
    llvm.add_symbol(name, address)


@functools.cache
def _engine() -> llvm.LLJIT:
    """The ORC LLJIT for this process; deliberately never disposed, as code may run until exit."""
    engine = llvm.create_lljit_compiler(
        target_machine(host_target(), jit=True), suppress_errors=True
    )
    engine._owned = True  # llvmlite's flag for "never dispose": workers may run its code at exit
    return engine


def link_object(name: str, data: bytes, exports: tuple[str, ...]) -> tuple[str, dict[str, int]]:
    """Link `data` as a new library; returns its name and the addresses of `exports`.

    Libraries are never unloaded: callers may hold raw function pointers for the process.
    """
    with LLVM_LOCK:
        builder = llvm.JITLibraryBuilder().add_object_img(data).add_current_process()
        for symbol, address in _runtime_symbols.items():
            if symbol not in exports:
                builder.import_symbol(symbol, address)
        for symbol in exports:
            builder.export_symbol(symbol)
        library = f"{name}.{next(_library_ids)}"
        try:
            tracker = builder.link(_engine(), library)
        except RuntimeError as exc:
            raise CompileError(
                f"cannot link module {name!r} into the process: {exc}; every declared function "
                "must exist in libc/libm, the tilefold runtime or the module itself"
            ) from exc
        addresses = {symbol: tracker[symbol] for symbol in exports}
        tracker.detach()
        return library, addresses
