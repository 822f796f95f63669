"""`CompiledModule`: a compiled LLVM module, its object code and, on this host, its entry points."""

from __future__ import annotations

import ctypes
from typing import Any

from tilefold.errors import CompileError, UnsupportedError
from tilefold.runtime.jit import link_object
from tilefold.runtime.switch import Switch
from tilefold.target import Target, host_target

# Within `planning_only()`: a module for a target this host cannot run hands out functions that
# refuse when called, instead of refusing to hand them out, so a plan for that target can be
# made (its methods and kernels chosen and built) and inspected, never run
# (`CompiledGraph.decisions` of a graph compiled for znver4 on an AVX2 host). The kernels'
# process-wide caches keep those functions: a graph compiled for that target later in this
# process refuses to run (UnsupportedError) where it would have fallen back to NumPy, so plan
# in a process of its own when that matters.
PLANNING_ONLY = Switch("tilefold_planning_only")
planning_only = PLANNING_ONLY.on


class CompiledModule:
    """Object code for one target; linked into the process JIT when the target can run here."""

    def __init__(
        self,
        *,
        name: str,
        target: Target,
        key: str,
        object_code: bytes,
        exports: tuple[str, ...],
        compile_seconds: float,
        from_cache: bool,
        recipe: Any = None,
    ):
        self.name = name
        self.target = target
        self.key = key
        self.object_code = object_code
        self.exports = exports
        self.compile_seconds = compile_seconds
        self.from_cache = from_cache
        self.recipe = recipe  # how to make its IR again (`build.Recipe`)
        self.runnable = target.is_host()
        self._addresses: dict[str, int] = {}
        self._functions: dict[tuple, Any] = {}
        self.library: str | None = None  # the JIT library's name, once linked
        if self.runnable:
            self.library, self._addresses = link_object(name, object_code, exports)

    def address(self, symbol: str) -> int:
        """The run-time address of an exported function or global."""
        if not self.runnable:
            host = host_target()
            raise UnsupportedError(
                f"module {self.name!r} was compiled for {self.target.name} ({self.target.arch}, "
                f"cpu {self.target.cpu}) and cannot run on this {host.arch} host ({host.name}); "
                "inspect it with emit_assembly() or run it under an emulator"
            )
        if symbol not in self._addresses:
            raise CompileError(
                f"module {self.name!r} exports no symbol {symbol!r} "
                f"(it exports: {', '.join(self.exports) or 'nothing'}); check the name and "
                "that the definition is not internal/private"
            )
        return self._addresses[symbol]

    def symbol_at(self, address: int) -> str | None:
        """The exported symbol linked at `address` in this process, if any."""
        return next((s for s, a in self._addresses.items() if a == address), None)

    def function(self, symbol: str, restype: Any, *argtypes: Any) -> Any:
        """A ctypes function for `symbol` with this C signature, built once and reused."""
        signature = (symbol, restype, argtypes)
        if not self.runnable and PLANNING_ONLY.get():
            if symbol not in self.exports:
                self.address(symbol)  # its own error
            return _Unrunnable(self, symbol, argtypes)
        function = self._functions.get(signature)
        if function is None:
            function = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(symbol))
            self._functions[signature] = function
        return function

    def __repr__(self) -> str:
        origin = "cache" if self.from_cache else f"{self.compile_seconds * 1e3:.1f} ms"
        return f"CompiledModule({self.name!r}, {self.target.name}, {origin})"


class _Unrunnable:
    """A function of a module for a target this host cannot run, handed out while planning
    only: it refuses when called."""

    def __init__(self, module: CompiledModule, symbol: str, argtypes: tuple):
        self.module, self.symbol, self.argtypes = module, symbol, argtypes

    def __call__(self, *args: Any) -> Any:
        self.module.address(self.symbol)  # raises UnsupportedError: cannot run on this host
