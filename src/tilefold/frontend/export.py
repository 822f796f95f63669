"""`from_exported_program`: a `torch.export` program as a tilefold IR module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from tilefold.errors import UnsupportedError
from tilefold.frontend.converter import Input, convert_graph
from tilefold.frontend.lowering import RULES
from tilefold.ir import Module

aten = torch.ops.aten

def inference_decompositions() -> dict:
    """PyTorch's default decomposition table minus the ops tilefold lowers whole (rules
    registered with `whole=True`; SDPA's decomposition also breaks on GPT-2)."""
    table = torch.export.default_decompositions()
    for target, rule in RULES.items():
        if rule.whole:
            table.pop(target, None)
    return table


def from_exported_program(
    ep: ExportedProgram,
    *,
    dim_names: Mapping[str, Sequence[str | None]] | None = None,
    decompose: bool = True,
    name: str = "main",
) -> Module:
    """Lower a `torch.export.export(...)` program to a tilefold module.

    Parameters, buffers and lifted constants become IR constants; user inputs become function
    arguments named like the program's inputs. Dims exported as `torch.export.Dim` are symbolic;
    `dim_names={"input_ids": ("batch", "seq")}` names them (default: PyTorch's `s0`, `s1`).
    Raises UnsupportedError listing every ATen op that has no lowering rule.
    """
    if decompose:
        ep = ep.run_decompositions(inference_decompositions())
    sig = ep.graph_signature
    if any(s.kind not in (OutputKind.USER_OUTPUT,) for s in sig.output_specs):
        kinds = sorted({s.kind.name for s in sig.output_specs})
        raise UnsupportedError(f"exported program mutates its inputs or buffers ({kinds})")
    specs = sig.input_specs
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]

    def inputs(i: int, node: fx.Node) -> Input:
        spec = specs[i]
        if spec.kind == InputKind.USER_INPUT:
            if not isinstance(node.meta.get("val"), torch.Tensor):
                return ("size", None)
            return ("arg", spec.arg.name)
        return ("constant", _lifted(ep, spec))

    names = _symbol_names(placeholders, specs, dim_names or {})
    converted = convert_graph(ep.graph, inputs, name=name, dim_names=names)
    if converted.flattened:
        outs = ", ".join(str(i) for i in sorted(converted.flattened))
        raise UnsupportedError(f"output {outs}: its first size is a product of symbolic sizes, "
                               "which an IR result cannot have; return the tensor unflattened")
    return converted.module


def symbolic_bounds(ep: ExportedProgram,
                    dim_names: Mapping[str, Sequence[str | None]] | None = None
                    ) -> dict[str, tuple[int, int | None]]:
    """Each symbolic dim of the program's inputs, named as `from_exported_program` names it
    (`dim_names`, else PyTorch's symbol), with the bounds `torch.export` proved for it:
    (min, max), max None when unbounded."""
    specs = ep.graph_signature.input_specs
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    names = _symbol_names(placeholders, specs, dim_names or {})
    bounds: dict[str, tuple[int, int | None]] = {}
    for node, spec in zip(placeholders, specs, strict=True):
        if spec.kind != InputKind.USER_INPUT:
            continue
        for size in getattr(node.meta.get("val"), "shape", ()):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                symbol = size.node.expr
                ranges = ep.range_constraints.get(symbol)
                lower = int(ranges.lower) if ranges is not None and ranges.lower.is_Integer \
                    else 0
                upper = int(ranges.upper) if ranges is not None and ranges.upper.is_Integer \
                    else None  # int_oo: no bound
                bounds[names.get(symbol.name, symbol.name)] = (lower, upper)
    return bounds


def _lifted(ep: ExportedProgram, spec: Any) -> torch.Tensor:
    if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in ep.state_dict:
        return ep.state_dict[spec.target]
    if spec.target in ep.constants:
        value = ep.constants[spec.target]
        if isinstance(value, torch.Tensor):
            return value
    raise UnsupportedError(f"input {spec.arg.name} ({spec.kind.name}) is not a tensor constant")


def _symbol_names(placeholders: list[fx.Node], specs: list[Any],
                  dim_names: Mapping[str, Sequence[str | None]]) -> dict[str, str]:
    """torch symbol -> IR dim name, from the user's per-input axis names."""
    names: dict[str, str] = {}
    for node, spec in zip(placeholders, specs, strict=True):
        wanted = dim_names.get(spec.arg.name, ())
        val = node.meta.get("val")
        for size, want in zip(getattr(val, "shape", ()), wanted, strict=False):
            if want and isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                names.setdefault(size.node.expr.name, want)
    return names
