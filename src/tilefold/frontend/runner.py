"""Runs a lowered graph on PyTorch tensors: argument selection, checks, and the executor choice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefold.frontend.converter import Converted
from tilefold.frontend.tensors import to_numpy, to_torch
from tilefold.ir import Module, interpret
from tilefold.ir.interpreter import bind_symbols

EXECUTOR = "interpreter"


def executor(module: Module) -> Callable[..., list[np.ndarray]]:
    """How a lowered module runs: the one line to switch to `tilefold.compile` when it lands."""
    return lambda *arrays: interpret(module, *arrays)


class GraphRunner:
    """Calls a lowered graph with the graph's own (flat) arguments and returns torch tensors.

    Inputs are checked against the IR signature before anything runs, so a wrong shape or
    dtype is a `ShapeError`/`DTypeError` naming the input, not a failure deep in a kernel.
    """

    def __init__(self, converted: Converted):
        self.converted = converted
        self.function = converted.module.functions[next(iter(converted.module.functions))]
        self.run = executor(converted.module)

    def __call__(self, *args: Any) -> list[Any]:
        arrays = [to_numpy(args[i]) for i in self.converted.arg_indices]
        bind_symbols(self.function, arrays)
        results = [to_torch(r) for r in self.run(*arrays)]
        return [None if i is None else results[i] for i in self.converted.outputs]

