"""The public low-precision entry points: quantize, dequantize, and matmuls on quantized weights,
bf16/f16 operands and 8-bit integers (what `tilefold.matmul` dispatches to)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from tilefold.codegen.llvm.lowp.dotpack import PackedB, run_dotgemm
from tilefold.codegen.llvm.lowp.kernels import DotKernel, select_dot_kernel
from tilefold.codegen.llvm.lowp.weight_only import weight_only_matmul
from tilefold.dtypes import DType
from tilefold.dtypes import dtype as to_dtype
from tilefold.errors import DTypeError, ShapeError, UnsupportedError
from tilefold.quant.quantize import quantize
from tilefold.quant.tensor import QuantizedTensor
from tilefold.target import Target, host_target

__all__ = ["QuantizedTensor", "dequantize", "matmul_lowp", "prepack_lowp", "quantize",
           "quantized_matmul"]

# (A dtype, B dtype) -> micro-kernel dtype; A signed 8-bit is shifted to unsigned.
_KERNEL_DTYPES = {("bf16", "bf16"): "bf16", ("f16", "f16"): "f16", ("u8", "i8"): "u8s8",
                  ("i8", "i8"): "s8s8"}


def has_lowp_kernel(a_dtype: np.dtype, b_dtype: np.dtype) -> bool:
    """Whether `matmul_lowp` has a kernel family for this pair of NumPy dtypes."""
    try:
        return (to_dtype(a_dtype).name, to_dtype(b_dtype).name) in _KERNEL_DTYPES
    except DTypeError:
        return False


def widened_source(a_dtype: np.dtype, b_dtype: np.dtype, target: Target) -> str | None:
    """"bf16" or "f16" when `target`'s registry entry for this pair of NumPy dtypes runs it on
    the f32 GEMM with widening packing (no bf16/f16 dot unit), else None."""
    try:
        kind = _KERNEL_DTYPES.get((to_dtype(a_dtype).name, to_dtype(b_dtype).name))
        return kind if kind is not None and select_dot_kernel(target, kind).widens else None
    except (DTypeError, UnsupportedError):
        return None


def dequantize(qt: QuantizedTensor, dtype: str | DType = "f32") -> np.ndarray:
    """The real values of `qt` as a `dtype` array (the IR's `dequantize`)."""
    return qt.dequantize(dtype)


def _as_rows(x: np.ndarray, k: int, what: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """x[..., K] as a C-contiguous [M, K] matrix and the leading shape to restore."""
    if x.ndim == 0 or x.shape[-1] != k:
        raise ShapeError(f"{what}: x has shape {list(x.shape)} but the contraction length is "
                         f"{k}; x's last dim must equal it")
    lead = x.shape[:-1]
    return np.ascontiguousarray(x.reshape(math.prod(lead), k)), lead  # (-1 fails for K = 0)


def quantized_matmul(x: ArrayLike, qw: QuantizedTensor, *, target: Target | None = None,
                     threads: int | None = None) -> np.ndarray:
    """x[..., K] (f32/bf16/f16) times the weight `qw`, contracting qw's quantization axis.

    For a [K, N] weight quantized along axis 0 this is x @ dequantize(qw); for a [N, K] weight
    along axis 1 (torch Linear) it is x @ dequantize(qw).T. Weights are decoded in registers,
    never materialized; the result is f32[..., N].
    """
    if not isinstance(qw, QuantizedTensor):
        raise DTypeError(f"quantized_matmul: qw must be a QuantizedTensor, got {type(qw)}; "
                         "make one with tilefold.quantize(w, ...)")
    if len(qw.shape) != 2:
        raise ShapeError(f"quantized_matmul: the weight must be 2-D, got {list(qw.shape)}")
    x = np.asarray(x)
    if to_dtype(x.dtype).name not in ("f32", "bf16", "f16", "f64"):
        raise DTypeError(f"quantized_matmul: activations must be float, got {x.dtype}; "
                         "quantize both sides with matmul_lowp for integer math")
    k = qw.shape[qw.axis]
    rows, lead = _as_rows(x.astype(np.float32, copy=False), k, "quantized_matmul")
    y = weight_only_matmul(rows, qw, target, threads)
    return y.reshape(*lead, y.shape[-1])


def _kernel_for(a_dtype, b_dtype, target: Target) -> DotKernel:
    a, b = to_dtype(a_dtype).name, to_dtype(b_dtype).name
    kind = _KERNEL_DTYPES.get((a, b))
    if kind is None:
        pairs = ", ".join(f"{x} x {y}" for x, y in _KERNEL_DTYPES)
        raise DTypeError(f"matmul_lowp: no kernel for {a} x {b}; supported: {pairs} "
                         "(cast the operands, or use tilefold.matmul in f32)")
    return select_dot_kernel(target, kind)


def prepack_lowp(b: np.ndarray, a_dtype: str | DType | np.dtype | type, *,
                 target: Target | None = None) -> PackedB:
    """Pack a constant B[K, N] once for `matmul_lowp` with A operands of `a_dtype`."""
    target = target or host_target()
    b = np.asarray(b)
    if b.ndim != 2:
        raise ShapeError(f"prepack_lowp: B must be 2-D, got shape {list(b.shape)}")
    return PackedB(b, _kernel_for(a_dtype, b.dtype, target), target)


def matmul_lowp(a: ArrayLike, b: ArrayLike | PackedB, *, row_scale: ArrayLike | None = None,
                col_scale: ArrayLike | None = None, bias: ArrayLike | None = None,
                target: Target | None = None, threads: int | None = None) -> np.ndarray:
    """a[..., K] @ b[K, N] for bf16 x bf16 and f16 x f16 (-> f32, f32 accumulation) and
    u8/i8 x i8 (-> int32: exact, or past 2**31 wrapped as NumPy's int32 matmul wraps). With
    `col_scale` (and optional `row_scale`, `bias`) the 8-bit product is dequantized in the
    kernel's epilogue: f32 = sum * row_scale[m] * col_scale[n] + bias[n], which never wraps.
    `b` may be a `prepack_lowp` result.
    """
    target = target or host_target()
    a = np.asarray(a)
    if not isinstance(b, PackedB):
        b = np.asarray(b)
        if b.ndim != 2:
            raise ShapeError(f"matmul_lowp: B must be 2-D [K, N], got shape {list(b.shape)}")
    kernel = _kernel_for(a.dtype, b.dtype, target)
    if isinstance(b, PackedB) and b.kernel != kernel:
        raise DTypeError(f"matmul_lowp: B was packed for {b.kernel.name}, this call "
                         f"needs {kernel.name}; prepack it for this target and A dtype")
    k, n = (b.k, b.n) if isinstance(b, PackedB) else b.shape
    rows, lead = _as_rows(a, k, "matmul_lowp")
    dequant = None
    if col_scale is not None or row_scale is not None or bias is not None:
        if kernel.acc_is_float:
            raise DTypeError("matmul_lowp: scales and bias apply to 8-bit operands only")
        m = rows.shape[0]
        dequant = (_vector(row_scale, m, 1.0, "row_scale"),
                   _vector(col_scale, n, 1.0, "col_scale"), _vector(bias, n, 0.0, "bias"))
    c = run_dotgemm(rows, b, kernel, target, dequant=dequant, threads=threads)
    return c.reshape(*lead, n)


def _vector(v, n: int, default: float, name: str) -> np.ndarray:
    if v is None:
        return np.full(n, default, np.float32)
    v = np.broadcast_to(np.asarray(v, np.float32), (n,)) if np.ndim(v) <= 1 else None
    if v is None:
        raise ShapeError(f"matmul_lowp: {name} must be a scalar or a vector of length {n}")
    return np.ascontiguousarray(v)
