"""PyTorch models for `tilefold.export`: a `torch.nn.Module`, exported by `torch.export` at the
example inputs' static shapes (or with torch.export's `dynamic_shapes`, whose `Dim`s become the
artifact's symbolic dims and bounds), or an `ExportedProgram` (one with symbolic dims exported
again at the example inputs' shapes), becomes a tilefold Module through the torch.export
frontend (`frontend/export.py`), its parameters and buffers as constants. Torch is imported
only when the object handed over is already one of its own."""

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


def torch_module(model: Any, inputs: Sequence[Any], dynamic_shapes: Any = None
                 ) -> tuple[Module, list[np.ndarray], dict[str, tuple[int, int]] | None]:
    """`model` as a tilefold Module with function `main`, `inputs` (tensors or arrays, in
    the order of the model's positional arguments) as NumPy arrays for it, and, when
    `dynamic_shapes` (torch.export's, e.g. `{"input_ids": {1: Dim("seq", max=512)}}`) is
    given, each symbolic dim of the Module (named as its `Dim`) with its bounds."""
    import torch

    from tilefold.frontend.export import from_exported_program, symbolic_bounds

    tensors = []
    for i, x in enumerate(inputs):
        if not isinstance(x, (torch.Tensor, np.ndarray)):
            raise UnsupportedError(
                f"example input {i} is a {type(x).__name__}; export takes tensors or NumPy "
                "arrays, one per positional argument of the model (bind other arguments "
                "with a wrapper module or functools.partial)")
        tensors.append(torch.as_tensor(x).detach().cpu())
    program = model
    if isinstance(model, torch.export.ExportedProgram) and (
            model.range_constraints or dynamic_shapes is not None):
        # An artifact's symbolic dims are the ones `dynamic_shapes` asks for: the program is
        # exported again at the inputs (without any, its sizes fold: position ranges and
        # masks become constants).
        model = model.module()
    if isinstance(model, torch.nn.Module):
        try:
            with torch.no_grad():
                program = torch.export.export(model, tuple(tensors),
                                              dynamic_shapes=dynamic_shapes)
        except Exception as exc:  # torch's own errors: what failed is in its message
            first = (str(exc).strip().splitlines() or [""])[0]
            raise UnsupportedError(
                f"torch.export could not export {type(model).__name__} at these inputs "
                f"({type(exc).__name__}: {first}); export it yourself with "
                "torch.export.export and pass the ExportedProgram") from exc
    if dynamic_shapes is None:
        return from_exported_program(program), [t.numpy() for t in tensors], None
    names = _dim_names(program, dynamic_shapes)
    bounds = {}
    for name, (lo, hi) in symbolic_bounds(program, names).items():
        if hi is None:
            raise UnsupportedError(
                f"the symbolic dim {name} has no upper bound: an artifact is exported for "
                f"sizes within bounds; give it one, e.g. Dim({name!r}, max=512)")
        bounds[name] = (max(lo, 1), hi)  # torch's Dims start at 0: an artifact's at 1
    return (from_exported_program(program, dim_names=names), [t.numpy() for t in tensors],
            bounds)


def _dim_names(program: Any, dynamic_shapes: Any) -> dict[str, tuple[str | None, ...]]:
    """Per user input, the names of its dims given as `Dim`s in `dynamic_shapes` (by the
    model's argument names or by position, as torch.export takes them); `Dim.AUTO` and
    the like keep PyTorch's symbol name."""
    from torch.export.graph_signature import InputKind

    users = [s.arg.name for s in program.graph_signature.input_specs
             if s.kind == InputKind.USER_INPUT]
    specs = dynamic_shapes if isinstance(dynamic_shapes, dict) else dict(
        zip(users, dynamic_shapes, strict=False))
    names = {}
    for user, spec in specs.items():
        axes = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        named = dict(axes)
        if named:
            names[user] = tuple(getattr(named.get(i), "__name__", None)
                                for i in range(max(named) + 1))
    return names


def export(module: Module | Any, inputs: Sequence[Any], path: str | Path, **options: Any
           ) -> Path:
    """`tilefold.export`: `aot.export` of `module`, a tilefold Module, a `torch.nn.Module`
    (exported by `torch.export` at `inputs`, tensors or arrays, in the mode it is in: call
    `.eval()` first for inference) or an `ExportedProgram`, whose weights become constants.
    For a torch model `dynamic_shapes` is torch.export's (`Dim`s with a `max`): the
    artifact serves every size within each `Dim`'s bounds."""
    if is_torch_model(module):
        module, inputs, options["dynamic_shapes"] = torch_module(
            module, inputs, options.get("dynamic_shapes"))
    return export_module(module, inputs, path, **options)
