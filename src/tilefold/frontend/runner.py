"""Runs a lowered graph on PyTorch tensors: argument selection, checks, and the executor choice."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tilefold.errors import TilefoldError
from tilefold.frontend.converter import Converted
from tilefold.frontend.tensors import to_numpy, to_torch
from tilefold.ir import Module, interpret
from tilefold.ir.interpreter import bind_symbols
from tilefold.runtime import thread_pool

log = logging.getLogger("tilefold.frontend")


class Executor:
    """Runs a module on NumPy arrays with `tilefold.compile`; the reference interpreter takes
    over (with a log line) if compilation or a kernel method fails for this module."""

    def __init__(self, module: Module):
        self.module = module
        self.compiled: Any = None
        self.name = "interpreter"
        self.last_shapes: list[tuple] | None = None
        try:
            from tilefold.compiler import compile as tilefold_compile

            self.compiled = tilefold_compile(module)
            self.name = "tilefold.compile"
        except (ImportError, TilefoldError) as exc:
            self._fall_back(exc)

    def _fall_back(self, exc: Exception) -> None:
        log.warning("tilefold: running on the reference interpreter: %s: %s",
                    type(exc).__name__, exc)
        self.compiled, self.name = None, "interpreter"

    def decisions(self) -> list[Any]:
        """The kernel choices (`strategy.Decision`) made for the shapes of the last call."""
        if self.compiled is None or self.last_shapes is None:
            return []
        return self.compiled.decisions(*self.last_shapes)

    def methods(self) -> dict[str, int]:
        """How many ops (fused groups, when compiled) each kernel method ran at the last call."""
        if self.compiled is not None and self.last_shapes is not None:
            counts: dict[str, int] = {}
            for d in self.decisions():
                method = d.winner.method if d.winner is not None else "none"
                counts[method] = counts.get(method, 0) + 1
            return counts
        ops = [op for op in self.module.walk() if op.name not in ("constant", "return")]
        return {"interpreter": len(ops)}

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        self.last_shapes = [a.shape for a in arrays]
        if self.compiled is not None:
            try:
                return self.compiled(*arrays)
            except Exception as exc:  # a compiler gap must not fail the model: log, interpret
                self._fall_back(exc)
        return interpret(self.module, *arrays)


class GraphRunner:
    """Calls a lowered graph with the graph's own (flat) arguments and returns torch tensors.

    Inputs are checked against the IR signature before anything runs, so a wrong shape or
    dtype is a `ShapeError`/`DTypeError` naming the input, not a failure deep in a kernel.
    """

    def __init__(self, converted: Converted):
        self.converted = converted
        self.function = converted.module.functions[next(iter(converted.module.functions))]
        self.run = Executor(converted.module)

    @property
    def executor(self) -> str:
        return self.run.name

    def __call__(self, *args: Any) -> list[Any]:
        arrays = [to_numpy(args[i]) for i in self.converted.arg_indices]
        bind_symbols(self.function, arrays)
        outputs = self.run(*arrays)
        thread_pool().park()  # PyTorch runs next: its threads get the CPUs, not our spinners
        results = [to_torch(r) for r in outputs]
        return [None if i is None else results[i] for i in self.converted.outputs]
