"""The documented error bounds of every low-precision path, in one place (tests assert them).

Two kinds of error are kept apart. *Quantization* error (|w - dequantize(quantize(w))|, per
element) is the format's: half a code step for integers, half an ulp of the minifloat (plus
half its smallest subnormal) for fp8/fp4. *Kernel* error is measured against a float64
reference of the dequantized math, y_ref = x @ dequantize(qw) (or a @ b for bf16/f16): kernels
multiply exactly (bf16 and f16 products fit in f32; weights decode exactly to f32) and accumulate
K terms in f32, so |y - y_ref| <= (K + 2) * 2**-24 * (|x| @ |w|) elementwise. Integer paths are
exact. `vdpbf16ps` flushes subnormal inputs to zero: the bound holds for normal-range data.
"""

from __future__ import annotations

import numpy as np

from tilefold.ir.ops.quant import expand_blocks
from tilefold.quant.tensor import QuantizedTensor

F32_UNIT_ROUNDOFF = 2.0**-24
# (relative, absolute in units of the block's scale) half-spacing of each format's codes.
_STEP = {
    "int8": (0.0, 0.5),
    "int4": (0.0, 0.5),
    "fp8": (2.0**-4, 2.0**-10),  # e4m3: 3 mantissa bits; smallest subnormal 2**-9
    "fp4": (2.0**-2, 0.25),  # e2m1: 1 mantissa bit; smallest subnormal 0.5
}


def quantization_bound(w: np.ndarray, qt: QuantizedTensor) -> np.ndarray:
    """Elementwise bound on |w - dequantize(qt)| for `qt = quantize(w, ...)`."""
    rel, absolute = _STEP[qt.format.name]
    scale = expand_blocks(qt.scale.astype(np.float64), tuple(qt.shape))
    return rel * np.abs(np.asarray(w, np.float64)) + absolute * scale * (1 + 1e-6)


def matmul_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Elementwise bound on |y - x @ w| (float64 reference) for an f32-accumulating kernel."""
    x64, w64 = np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64))
    k = x64.shape[-1]
    return (k + 2) * F32_UNIT_ROUNDOFF * (x64 @ w64)


def corrected_matmul_bound(x: np.ndarray, w: np.ndarray, correction: np.ndarray) -> np.ndarray:
    """Bound on |y - x @ w| for a kernel that sums x * (w - c) and adds c * sum(x) per group,
    with `correction` c expanded to w's shape (zero points, offsets): both sums carry
    (K + 2) f32 roundings of terms no larger than |x| (|w| + |c|)."""
    c = np.abs(np.asarray(correction, np.float64))
    return matmul_bound(x, np.abs(np.asarray(w, np.float64)) + 2 * c)


ACTIVATION_BLOCK = 32


def q8_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The int8 activations the integer-dot kernels multiply by (llama.cpp's Q8_0 blocks):
    per row and block of 32 k, dx = f32(max|x| / 127) and q = rint(x / dx) in f32 (0 where dx
    is 0). Returns (q as int8 [M, K], dx as f32 [M, K/32])."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    blocks = x.reshape(m, k // ACTIVATION_BLOCK, ACTIVATION_BLOCK)
    dx = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(dx[..., None] > 0, np.rint(blocks / dx[..., None]), 0)
    return q.astype(np.int8).reshape(m, k), dx


def dequantized_activations(x: np.ndarray) -> np.ndarray:
    """q8_activations(x) as float64 values q * dx: what an integer-dot kernel computes with."""
    q, dx = q8_activations(x)
    return q.astype(np.float64) * np.repeat(dx.astype(np.float64), ACTIVATION_BLOCK, axis=1)


def activation_quantization_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Bound on |y_dot - x @ w| from quantizing the activations alone: each x[m, k] moves at
    most dx / 2 (half a code step of its block), so y moves at most (dx / 2) @ |w|."""
    _, dx = q8_activations(x)
    half = np.repeat(dx.astype(np.float64), ACTIVATION_BLOCK, axis=1) / 2
    return half @ np.abs(np.asarray(w, np.float64))
