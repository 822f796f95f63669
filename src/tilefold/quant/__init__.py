"""Low precision as ordinary dtypes: quantized formats, `QuantizedTensor`, and their matmuls.

The names below are imported on first use: reading a GGUF file's header (`quant.gguf`) must not
bring in the matmuls' code generators (and LLVM) with them.
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {"QuantizedTensor": "tilefold.quant.api", "dequantize": "tilefold.quant.api",
         "matmul_lowp": "tilefold.quant.api", "prepack_lowp": "tilefold.quant.api",
         "quantize": "tilefold.quant.api", "quantized_matmul": "tilefold.quant.api",
         "FORMATS": "tilefold.quant.formats", "Format": "tilefold.quant.formats"}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module 'tilefold.quant' has no attribute {name!r}")
    module = importlib.import_module(_FROM[name])
    # every name of that module bound at once: importing `api` imports the submodule
    # `quant.quantize`, which would otherwise shadow the function `quantize`
    globals().update({n: getattr(module, n) for n, m in _FROM.items() if m == module.__name__})
    return globals()[name]
