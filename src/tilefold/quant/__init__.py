"""Low precision as ordinary dtypes: quantized formats, `QuantizedTensor`, and their matmuls."""

from tilefold.quant.api import (
    QuantizedTensor,
    dequantize,
    matmul_lowp,
    prepack_lowp,
    quantize,
    quantized_matmul,
)
from tilefold.quant.formats import FORMATS, Format

__all__ = ["FORMATS", "Format", "QuantizedTensor", "dequantize", "matmul_lowp", "prepack_lowp",
           "quantize", "quantized_matmul"]
