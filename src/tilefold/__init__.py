"""tilefold: a compiler for AI programs that generates fused, portable kernels at vendor speed.

The public surface is re-exported here; everything else is implementation.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from tilefold.errors import (
    ArtifactError,
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
from tilefold.version import __version__

# The rest of the surface (name -> the module defining it, or the module itself) is imported
# on first use: `tilefold.load` runs an exported
# artifact with NumPy alone, so `import tilefold` must not bring in LLVM (or the compiler).
_LAZY = {
    "CompiledGraph": "tilefold.compiler", "compile": "tilefold.compiler",
    "Builder": "tilefold.ir", "Module": "tilefold.ir", "Tensor": "tilefold.ir",
    "interpret": "tilefold.ir", "parse_file": "tilefold.ir", "parse_module": "tilefold.ir",
    "print_module": "tilefold.ir", "trace": "tilefold.ir", "verify": "tilefold.ir",
    "functional": "tilefold.ir.functional", "matmul": "tilefold.linalg",
    "prepack": "tilefold.linalg",
    "run_pipeline": "tilefold.passes", "QuantizedTensor": "tilefold.quant",
    "dequantize": "tilefold.quant", "host_target": "tilefold.target",
    "named_target": "tilefold.target", "export": "tilefold.frontend.aot_export",
    "load": "tilefold.artifact",
}


def __getattr__(name: str) -> Any:
    """A name of the public surface (or a subpackage), imported when first asked for."""
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__.endswith(f".{name}") else getattr(module, name)
    elif _is_subpackage(name):
        value = importlib.import_module(f"tilefold.{name}")
    else:
        raise AttributeError(f"module 'tilefold' has no attribute {name!r}")
    globals()[name] = value
    return value


def _is_subpackage(name: str) -> bool:
    import importlib.util  # here: `import tilefold` stays as light as `tilefold.load` needs

    return importlib.util.find_spec(f"tilefold.{name}") is not None


if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from tilefold.artifact import load
    from tilefold.compiler import CompiledGraph, compile
    from tilefold.frontend.aot_export import export
    from tilefold.ir import (
        Builder,
        Module,
        Tensor,
        functional,
        interpret,
        parse_file,
        parse_module,
        print_module,
        trace,
        verify,
    )
    from tilefold.linalg import matmul, prepack
    from tilefold.passes import run_pipeline
    from tilefold.quant import QuantizedTensor, dequantize
    from tilefold.target import host_target, named_target


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
    from tilefold.quant import quantize as quantize_array

    return quantize_array(x, format, **options)


__all__ = [
    "ArtifactError",
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
    "export",
    "from_exported_program",
    "functional",
    "host_target",
    "interpret",
    "load",
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
