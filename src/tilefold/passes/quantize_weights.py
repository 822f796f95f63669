"""quantize-weights: constant matmul weights become codes and scales, dequantized in the GEMM.

Decoding a token reads every weight once: the step is a matter of memory bytes, so weights
stored as int8 (a quarter of f32) or int4 (an eighth, plus a scale per 32) make it that much
faster (llama.cpp's Q8_0 / Q4_0 and torchao's weight-only schemes). The rewrite is

    %w = constant() {value = f32[N,K]}          %q = constant() {value = i8[N,K]}
    %y = matmul(%x, %w) {transpose_b = true} -> %s = constant() {value = f32[N,1]}
                                                %w = dequantize(%q, %s) {dtype = "f32"}
                                                %y = matmul(%x, %w) {transpose_b = true}

with scales along the contraction axis K (int8: one per output channel; int4: one per `group`
consecutive K), each the smallest that brings its block into the codes' range (int4: -8..7, so
a block's largest magnitude takes -8 or 7 and all 16 codes are used), rounded to f16 where
that is a normal f16 (as llama.cpp stores them: the kernels then stream 2 bytes a scale, 10% of
an int4 weight's bytes) and the codes chosen for the rounded scale. Fusion makes the dequantize
the matmul's prologue, and the weight-only kernels (`codegen/llvm/lowp`) decode the codes in
registers. Weights with fewer than `min-elements` elements (norms, tiny projections) and K not
divisible by the group (int4: 32, which also keeps K even for two codes a byte) stay f32.

A language model's vocabulary head (a returned projection to `HEAD_RATIO` times more features
than it reads) takes `head-format` (default int8): its error reaches every logit, and at int4
SmolLM2's perplexity on a GPL text rises from 19.3 to 23.2, against 21.8 with an int8 head
(llama.cpp's Q4_0 files likewise keep their output tensor at 6 bits).

A weight is quantized once per process: codes and scales are kept (weakly) by the weight's
bytes, so a model's prompt and decode graphs share them and the kernels' layouts built on them.
"""

from __future__ import annotations

import hashlib
import weakref

import numpy as np

from tilefold import dtypes
from tilefold.errors import PassError
from tilefold.ir import Function
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter, constant_of
from tilefold.runtime.numpy_threads import by_rows

# Format -> (code dtype, lowest and highest code, group along K; None: the whole of K).
FORMATS = {"int8": (dtypes.i8, -127.0, 127.0, None), "int4": (dtypes.i4, -8.0, 7.0, 32)}
# A returned matmul with at least this many times more output features than inputs is a head.
HEAD_RATIO = 4
# Ops through which a returned value still is the matmul's result, rearranged.
_VIEWS = frozenset({"reshape", "slice", "squeeze", "expand_dims", "cast"})


F16_NORMAL = (2.0**-14, 65504.0)


def quantize_weight(w: np.ndarray, axis: int, fmt: str, group_size: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Codes (zero point 0) and f32 scales of `w` blocked along `axis` (the `quantize` op's) by
    `group_size` (None: the format's), each block's smallest scale that fits it into [lowest,
    highest] code, rounded to f16 where every one stays a normal f16."""
    code, lowest, highest, group = FORMATS[fmt]
    group = group_size or group
    k = w.shape[axis]
    blocks = 1 if group is None else k // group
    moved = np.moveaxis(np.asarray(w, np.float32), axis, -1)
    block = moved.reshape(-1, blocks, k // blocks)

    def fit(lo: int, hi: int) -> np.ndarray:
        part = block[lo:hi]
        fits = np.maximum(part.max(axis=-1).astype(np.float64) / highest,
                          part.min(axis=-1).astype(np.float64) / lowest)
        return np.where(fits > 0, fits, 1.0).astype(np.float32)

    step = np.concatenate(by_rows(block.shape[0], fit, row_elements=k))
    half = step.astype(np.float16).astype(np.float32)
    if ((half >= F16_NORMAL[0]) & (half <= F16_NORMAL[1])).all():
        step = half
    # The `quantize` op's codes (x / scale in f64, rounded, clipped), block by block and a few
    # rows at a time: no expanded scales, no f64 copy of the whole weight.
    codes = np.empty(block.shape, code.np_dtype)

    def encode(lo: int, hi: int) -> None:
        q = np.rint(block[lo:hi] / step[lo:hi, :, None].astype(np.float64))
        codes[lo:hi] = np.clip(q, lowest, highest, out=q)

    by_rows(block.shape[0], encode, row_elements=k)
    scale = np.moveaxis(step.reshape(*moved.shape[:-1], blocks), -1, axis)
    codes = np.moveaxis(codes.reshape(moved.shape), -1, axis)
    return np.ascontiguousarray(codes), np.ascontiguousarray(scale)


@register_pass
class QuantizeWeights(Pass):
    """Store constant f32 matmul weights as int8 or int4 codes with scales (weight-only)."""

    options = (
        Option("format", str, "int8", "int8 (a scale per output channel) or int4 (per 32)"),
        Option("min-elements", int, 1 << 12, "smallest weight, in elements, to quantize"),
        Option("head-format", str, "int8", "format of a language model's vocabulary head"),
    )
    statistics = (Statistic("num-quantized", "weights stored as codes and scales"),)

    def run_on_function(self, fn: Function) -> None:
        for fmt in (self.format, self.head_format):
            if fmt not in FORMATS:
                raise PassError(f"quantize-weights: format {fmt!r} is not one of "
                                f"{', '.join(FORMATS)}")
        heads = _returned_matmuls(fn)
        rewriter = Rewriter(fn)
        for op in list(fn.body.ops):
            w = constant_of(op.operands[1]) if op.name == "matmul" else None
            if (w is None or w.ndim != 2 or w.dtype != np.float32 or w.size < self.min_elements
                    or op.operands[0].type.dtype != dtypes.f32 or op.attr("transpose_a")):
                continue
            axis = 1 if op.attr("transpose_b") else 0
            fmt = self.format
            if op in heads and w.shape[1 - axis] >= HEAD_RATIO * w.shape[axis]:
                fmt = self.head_format
            group = FORMATS[fmt][3]
            if group and w.shape[axis] % group:
                continue
            codes, scale = _quantized_once(w, axis, fmt)
            q = rewriter.create(op, "constant", [], {"value": codes}, loc=op.loc).results[0]
            s = rewriter.create(op, "constant", [], {"value": scale}, loc=op.loc).results[0]
            deq = rewriter.create(op, "dequantize", [q, s], {"dtype": dtypes.f32},
                                  loc=op.loc).results[0]
            op.operands = [op.operands[0], deq]  # the same f32 type: the matmul stays
            self.count("num-quantized")
        rewriter.erase_dead()


# Codes and scales by the weight's bytes and how they were quantized, held weakly (as long as
# some graph's IR holds them): a model's prompt and decode graphs, and any recompile, quantize
# each weight once and share the arrays, and with them the weight-only kernels' layouts, which
# `blocks._packed_once` keys by the codes array.
_CODES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_SCALES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _quantized_once(w: np.ndarray, axis: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    digest = hashlib.sha256(np.ascontiguousarray(w).data).hexdigest()
    key = (digest, w.shape, str(w.dtype), axis, fmt)
    codes, scale = _CODES.get(key), _SCALES.get(key)
    if codes is None or scale is None:
        codes, scale = quantize_weight(w, axis, fmt)
        _CODES[key], _SCALES[key] = codes, scale
    return codes, scale


def _returned_matmuls(fn: Function) -> set:
    """The matmuls whose results the function returns, as they are or through views."""
    found, todo = set(), list(fn.body.ops[-1].operands)
    while todo:
        op = todo.pop().defining_op
        if op is None:
            continue
        if op.name == "matmul":
            found.add(op)
        elif op.name in _VIEWS:
            todo.append(op.operands[0])
    return found
