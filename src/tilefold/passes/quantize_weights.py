"""quantize-weights: constant matmul weights become codes and scales, dequantized in the GEMM.

Decoding a token reads every weight once: the step is a matter of memory bytes, so weights
stored as int8 (a quarter of f32) or int4 (an eighth, plus a scale per 32) make it that much
faster (llama.cpp's Q8_0 / Q4_0 and torchao's weight-only schemes). The rewrite is

    %w = constant() {value = f32[N,K]}          %q = constant() {value = i8[N,K]}
    %y = matmul(%x, %w) {transpose_b = true} -> %s = constant() {value = f32[N,1]}
                                                %w = dequantize(%q, %s) {dtype = "f32"}
                                                %y = matmul(%x, %w) {transpose_b = true}

with symmetric scales along the contraction axis K (int8: one per output channel; int4: one
per `group` consecutive K), each rounded to f16 first where that is a normal f16 (as llama.cpp
stores them: the kernels then stream 2 bytes a scale, 10% of an int4 weight's bytes) and the
codes chosen for the rounded scale. Fusion makes the dequantize the matmul's prologue, and the
weight-only kernels (`codegen/lowp`) decode the codes in registers. Weights with fewer than
`min-elements` elements (norms, tiny projections) and K not divisible by the group (int4: 32,
which also keeps K even for two codes a byte) stay f32.
"""

from __future__ import annotations

import numpy as np

from tilefold import dtypes
from tilefold.errors import PassError
from tilefold.ir import Function
from tilefold.ir.ops.quant import Quantize
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter, constant_of

# Format -> (code dtype, largest code, group along K; None: the whole of K).
FORMATS = {"int8": (dtypes.i8, 127.0, None), "int4": (dtypes.i4, 7.0, 32)}


F16_NORMAL = (2.0**-14, 65504.0)


def quantize_weight(w: np.ndarray, axis: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric codes and f32 scales of `w` blocked along `axis` (the `quantize` op's), the
    scales rounded to f16 where every one stays a normal f16."""
    code, qmax, group = FORMATS[fmt]
    k = w.shape[axis]
    blocks = 1 if group is None else k // group
    moved = np.moveaxis(w.astype(np.float64), axis, -1)
    amax = np.abs(moved.reshape(*moved.shape[:-1], blocks, k // blocks)).max(axis=-1)
    scale = np.moveaxis(np.where(amax > 0, amax / qmax, 1.0), -1, axis).astype(np.float32)
    half = scale.astype(np.float16).astype(np.float32)
    if ((half >= F16_NORMAL[0]) & (half <= F16_NORMAL[1])).all():
        scale = half
    return Quantize.reference([w, scale], {"dtype": code}), scale


@register_pass
class QuantizeWeights(Pass):
    """Store constant f32 matmul weights as int8 or int4 codes with scales (weight-only)."""

    options = (
        Option("format", str, "int8", "int8 (a scale per output channel) or int4 (per 32)"),
        Option("min-elements", int, 1 << 12, "smallest weight, in elements, to quantize"),
    )
    statistics = (Statistic("num-quantized", "weights stored as codes and scales"),)

    def run_on_function(self, fn: Function) -> None:
        if self.format not in FORMATS:
            raise PassError(f"quantize-weights: format {self.format!r} is not one of "
                            f"{', '.join(FORMATS)}")
        group = FORMATS[self.format][2]
        rewriter = Rewriter(fn)
        for op in list(fn.body.ops):
            w = constant_of(op.operands[1]) if op.name == "matmul" else None
            if (w is None or w.ndim != 2 or w.dtype != np.float32 or w.size < self.min_elements
                    or op.operands[0].type.dtype != dtypes.f32 or op.attr("transpose_a")):
                continue
            axis = 1 if op.attr("transpose_b") else 0
            if group and w.shape[axis] % group:
                continue
            codes, scale = quantize_weight(w, axis, self.format)
            q = rewriter.create(op, "constant", [], {"value": codes}, loc=op.loc).results[0]
            s = rewriter.create(op, "constant", [], {"value": scale}, loc=op.loc).results[0]
            deq = rewriter.create(op, "dequantize", [q, s], {"dtype": dtypes.f32},
                                  loc=op.loc).results[0]
            name = op.results[0].name  # the new matmul takes over the old one's name
            op.results[0].name = rewriter.fresh_name()
            mm = rewriter.create(op, "matmul", [op.operands[0], deq], dict(op.attrs), [name],
                                 loc=op.loc)
            rewriter.replace(op, mm.results)
            self.count("num-quantized")
        rewriter.erase_dead()
