"""tilefold: a compiler for AI programs that generates fused, portable kernels at vendor speed.

The public surface is re-exported here; everything else is implementation.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from tilefold.compiler import CompiledGraph, compile
from tilefold.errors import (
    CacheError,
    CompileError,
    DTypeError,
    FallbackError,
    ParseError,
    PassError,
    ShapeError,
    TilefoldError,
    UnsupportedError,
    VerificationError,
)
from tilefold.ir import (
    Builder,
    Module,
    Tensor,
    interpret,
    parse_file,
    parse_module,
    print_module,
    trace,
    verify,
)
from tilefold.ir import functional as functional
from tilefold.linalg import matmul, prepack
from tilefold.passes import run_pipeline
from tilefold.quant import QuantizedTensor, dequantize
from tilefold.quant import quantize as _quantize_array
from tilefold.target import host_target, named_target
from tilefold.version import __version__

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def from_exported_program(ep: ExportedProgram, **options: Any) -> Module:
    """Convert a `torch.export.ExportedProgram` to a tilefold module (needs PyTorch)."""
    from tilefold.frontend import from_exported_program as convert

    return convert(ep, **options)


def quantize(x: Any, format: str = "int4", **options: Any) -> Any:
    """Quantize weights. An array becomes a `QuantizedTensor` (`tilefold.quant.quantize`:
    group_size, axis, symmetric, per_tensor). A PyTorch model has its linear layers replaced,
    in place, by weight-only layers at "int8" or "int4" (`frontend.quantize.quantize_model`:
    group_size, head, min_elements) and is returned: it runs in eager, and compiled by
    tilefold it runs the weight-only kernels."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.nn.Module):
        from tilefold.frontend.quantize import quantize_model

        return quantize_model(x, format, **options)
    return _quantize_array(x, format, **options)


__all__ = [
    "Builder",
    "CacheError",
    "CompileError",
    "CompiledGraph",
    "DTypeError",
    "FallbackError",
    "Module",
    "ParseError",
    "PassError",
    "QuantizedTensor",
    "ShapeError",
    "Tensor",
    "TilefoldError",
    "UnsupportedError",
    "VerificationError",
    "__version__",
    "compile",
    "dequantize",
    "from_exported_program",
    "functional",
    "host_target",
    "interpret",
    "matmul",
    "named_target",
    "parse_file",
    "parse_module",
    "prepack",
    "print_module",
    "quantize",
    "run_pipeline",
    "trace",
    "verify",
]
