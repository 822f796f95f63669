"""`CompiledModule`: a compiled LLVM module, its object code and, on this host, its entry points."""

from __future__ import annotations

import ctypes
from typing import Any

from tilefold.errors import CompileError, UnsupportedError
from tilefold.runtime.jit import link_object
from tilefold.target import Target, host_target


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
        function = self._functions.get(signature)
        if function is None:
            function = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(symbol))
            self._functions[signature] = function
        return function

    def __repr__(self) -> str:
        origin = "cache" if self.from_cache else f"{self.compile_seconds * 1e3:.1f} ms"
        return f"CompiledModule({self.name!r}, {self.target.name}, {origin})"
