"""PyTorch models for `tilefold.export`: a `torch.nn.Module`, exported by `torch.export` at the
example inputs' static shapes, or an `ExportedProgram` (one with symbolic dims exported again
at the example inputs' shapes), becomes a tilefold Module through the torch.export frontend
(`frontend/export.py`), its parameters and buffers as constants. Torch is imported only when
the object handed over is already one of its own."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.aot import export as export_module
from tilefold.errors import UnsupportedError
from tilefold.ir import Module


def is_torch_model(model: Any) -> bool:
    """Whether `model` is a `torch.nn.Module` or a `torch.export.ExportedProgram` (never
    imports torch: an object of torch's means torch is loaded already)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(
        model, (torch.nn.Module, torch.export.ExportedProgram))


def torch_module(model: Any, inputs: Sequence[Any]) -> tuple[Module, list[np.ndarray]]:
    """`model` as a tilefold Module with function `main`, and `inputs` (tensors or arrays, in
    the order of the model's positional arguments) as NumPy arrays for it."""
    import torch

    from tilefold.frontend.export import from_exported_program

    tensors = []
    for i, x in enumerate(inputs):
        if not isinstance(x, (torch.Tensor, np.ndarray)):
            raise UnsupportedError(
                f"example input {i} is a {type(x).__name__}; export takes tensors or NumPy "
                "arrays, one per positional argument of the model (bind other arguments "
                "with a wrapper module or functools.partial)")
        tensors.append(torch.as_tensor(x).detach().cpu())
    program = model
    if isinstance(model, torch.export.ExportedProgram) and model.range_constraints:
        # Symbolic dims: an artifact has static shapes, so the program is exported again at
        # the inputs' (its sizes then fold: position ranges and masks become constants).
        model = model.module()
    if isinstance(model, torch.nn.Module):
        try:
            with torch.no_grad():
                program = torch.export.export(model, tuple(tensors))
        except Exception as exc:  # torch's own errors: what failed is in its message
            first = (str(exc).strip().splitlines() or [""])[0]
            raise UnsupportedError(
                f"torch.export could not export {type(model).__name__} at these inputs "
                f"({type(exc).__name__}: {first}); export it yourself with "
                "torch.export.export and pass the ExportedProgram") from exc
    return from_exported_program(program), [t.numpy() for t in tensors]


def export(module: Module | Any, inputs: Sequence[Any], path: str | Path, **options: Any
           ) -> Path:
    """`tilefold.export`: `aot.export` of `module`, a tilefold Module, a `torch.nn.Module`
    (exported by `torch.export` at `inputs`, tensors or arrays, in the mode it is in: call
    `.eval()` first for inference) or an `ExportedProgram`, whose weights become constants."""
    if is_torch_model(module):
        if options.get("dynamic_shapes") is not None:
            raise UnsupportedError(
                "dynamic_shapes= is not supported for PyTorch models yet (they are exported "
                "at the example inputs' static shapes): convert the model to a tilefold "
                "Module with symbolic dims, or export one artifact per shape")
        module, inputs = torch_module(module, inputs)
    return export_module(module, inputs, path, **options)
