"""NumPy-level linear algebra on tilefold's generated kernels: `matmul` and `prepack`.

`matmul` follows `np.matmul` (1-D operands, broadcast batch dims, `out=`). float32 runs the
compiled BLIS-shaped GEMM, and so do bf16 x bf16 and f16 x f16 (-> f32) where the host has no
unit for them (the low-precision registry says so: operands widened while packed); elsewhere
these, u8/i8 x i8 (-> int32) and a `QuantizedTensor` weight (weight-only int4/fp4/fp8/int8 ->
f32) run the low-precision kernels of `tilefold.quant`; other dtypes run NumPy's matmul (the
extern method) with a logged note. Every
check happens before native code runs, so bad input raises a `TilefoldError`.
"""

from __future__ import annotations

import logging
import math

import numpy as np
from numpy.typing import ArrayLike

from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.errors import DTypeError, ShapeError, UnsupportedError
from tilefold.quant import QuantizedTensor, matmul_lowp, quantized_matmul
from tilefold.quant.api import PackedB, has_lowp_kernel, widened_source
from tilefold.runtime.thread_pool import thread_pool
from tilefold.target import host_target

__all__ = ["PackedMatrix", "matmul", "prepack"]

log = logging.getLogger("tilefold.kernels")
_F32 = np.dtype(np.float32)
_plans: dict[tuple, object] = {}
_MAX_PLANS = 4096
_noted: set[tuple[str, str]] = set()


def prepack(b: np.ndarray) -> PackedMatrix:
    """Pack a constant float32 B[K, N] (weights) once for the host's GEMM; pass it as matmul's
    `b` to skip B packing on every call. bf16/f16 B is widened into the same f32 panels where
    the host runs those GEMMs on the f32 one (else use `tilefold.quant.prepack_lowp`)."""
    b = np.asarray(b)
    if b.ndim != 2:
        raise ShapeError(f"prepack: B must be 2-D [K, N], got shape {b.shape}; "
                         "pre-pack each matrix of a batch separately")
    src = _source(b.dtype, b.dtype)
    if src is None:
        raise DTypeError(f"prepack: B must be float32 (or bf16/f16 on a host without units for "
                         f"them), got {b.dtype}; convert with .astype(np.float32), or use "
                         "tilefold.quant.prepack_lowp for bf16/f16/int8 kernels")
    return PackedMatrix(b if b.flags.aligned else np.ascontiguousarray(b), _module(src))


def _source(a_dtype: np.dtype, b_dtype: np.dtype) -> str | None:
    """The element type A and B are packed from when the host's f32 GEMM runs this pair:
    "f32", or "bf16"/"f16" when the low-precision registry widens that pair; else None."""
    if a_dtype == _F32 and b_dtype == _F32:
        return "f32"
    return widened_source(a_dtype, b_dtype, host_target())


def _module(src: str):
    """The host's GEMM module for A and B of `src` elements (f32: the shared `gemm_module()`)."""
    f32 = gemm_module()
    return f32 if src == "f32" else gemm_module(f32.target, f32.kernel, src)


def matmul(
    a: ArrayLike,
    b: ArrayLike | PackedMatrix | QuantizedTensor | PackedB,
    out: np.ndarray | None = None,
    *,
    threads: int | None = None,
) -> np.ndarray:
    """`np.matmul(a, b, out=out)` on tilefold kernels; `threads` defaults to the runtime's
    ($TILEFOLD_NUM_THREADS, else every allowed CPU).

    Everything but the per-call checks (data alignment, a writeable and separate `out`) is
    decided once per (shapes, strides, dtypes, out layout, threads) and cached: a small product
    costs a dictionary lookup and one native call."""
    if isinstance(b, QuantizedTensor | PackedB):
        return _lowp(a, b, out, threads)
    packed = isinstance(b, PackedMatrix)
    a = a if isinstance(a, np.ndarray) else np.asarray(a)
    if not packed:
        b = b if isinstance(b, np.ndarray) else np.asarray(b)
        if not b.flags.aligned:  # strides or address not in whole element steps
            b = np.ascontiguousarray(b)
    if not a.flags.aligned:
        a = np.ascontiguousarray(a)
    if out is None:
        out_key = None
    elif isinstance(out, np.ndarray):
        out_key = (out.shape, out.strides, out.dtype)
    else:
        raise DTypeError(f"matmul: out must be a NumPy array, got {type(out).__name__}")
    key = (a.shape, a.strides, a.dtype, b.shape, id(b) if packed else b.strides, b.dtype,
           out_key, threads)
    entry = _plans.get(key)
    if entry is None:
        # Pre-packed B is f32 panels whatever it was packed from: A's dtype decides.
        src = _source(a.dtype, a.dtype if packed else b.dtype)
        if src is None:
            if not packed and has_lowp_kernel(a.dtype, b.dtype):
                return _lowp(a, b, out, threads)
            return _extern(a, b, out, packed)
        entry = _plan(a, b, out, threads or thread_pool().size, packed, src)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = entry
    plan, out_shape, a_shape, b_shape, c_shape, k = entry
    if out is None:
        out = _allocate(out_shape, a, b)
    else:
        flags = out.flags
        if not flags.writeable:
            raise UnsupportedError("matmul: out is read-only; pass a writeable array")
        if _overlaps(out, a) or (not packed and _overlaps(out, b)):
            raise UnsupportedError(
                f"matmul: out (shape {out.shape}) shares memory with an input; NumPy would "
                "buffer, tilefold does not: pass a fresh out array or none")
        if not flags.aligned and plan is not None:  # the plan is per layout, not per address
            plan = _COPY
    if plan is None:  # empty result, or K == 0
        if out.size and k == 0:
            out[...] = 0
        return out
    c = out if c_shape is None else out.reshape(c_shape)
    if plan is _COPY:  # out's layout is not one the kernel writes: compute, then copy
        c[...] = matmul(a, b, threads=threads).reshape(c.shape)
        return out
    if a_shape is not None:
        a = a.reshape(a_shape)
    if packed:
        plan(a, b.data, c)
    else:
        plan(a, b if b_shape is None else b.reshape(b_shape), c)
    return out


_COPY = "copy"  # plan marker: compute into a fresh array, then copy into `out`


def _lowp(a, b, out, threads: int | None) -> np.ndarray:
    """Low-precision kernels: a QuantizedTensor weight (quantized along K, i.e. axis 0 of
    [K, N]) or a bf16/f16/int8 pair; the result is the f32 (or exact int32) accumulator."""
    if isinstance(b, QuantizedTensor):
        if b.axis != 0 or len(b.shape) != 2:
            raise ShapeError(
                f"matmul: a QuantizedTensor b must be [K, N] quantized along axis 0 (K), got "
                f"shape {list(b.shape)} along axis {b.axis}; use tilefold.quant."
                "quantized_matmul for torch-style [N, K] weights")
        result = quantized_matmul(a, b, threads=threads)
    elif isinstance(b, PackedB):
        result = matmul_lowp(a, b, threads=threads)
    else:
        result = _lowp_pair(a, b, threads)
    if out is None:
        return result
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ShapeError(f"matmul: out must be {result.dtype}{list(result.shape)} for these "
                         f"operands, got {out.dtype}{list(out.shape)}")
    out[...] = result
    return out


def _lowp_pair(a: np.ndarray, b: np.ndarray, threads: int | None) -> np.ndarray:
    """np.matmul's shapes on `matmul_lowp` (whose B is one [K, N] matrix): a 1-D operand gains
    a unit dim the result drops, A's batch dims ride along its rows, a batched B loops over
    the broadcast batch."""
    batch = _check_shapes(a, b)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if b2.ndim == 2:
        c = matmul_lowp(a2, b2, threads=threads)
    else:
        a3 = np.broadcast_to(a2, (*batch, *a2.shape[-2:]))
        b3 = np.broadcast_to(b2, (*batch, *b2.shape[-2:]))
        m, (k, n) = a2.shape[-2], b2.shape[-2:]
        if math.prod(batch):
            mats = [matmul_lowp(a3[i], b3[i], threads=threads) for i in np.ndindex(*batch)]
            c = np.stack(mats)
        else:  # an empty batch: the result's dtype from an empty product
            dtype = matmul_lowp(np.zeros((0, k), a.dtype), np.zeros((k, n), b.dtype)).dtype
            c = np.empty((0, m, n), dtype)
        c = c.reshape(*batch, m, n)
    if a.ndim == 1:
        c = c[..., 0, :]
    return c[..., 0] if b.ndim == 1 else c


def _extern(a, b, out, packed: bool) -> np.ndarray:
    """Dtypes without a compiled kernel run NumPy's matmul, noted once per dtype pair."""
    if packed:
        raise DTypeError(f"matmul: A is {a.dtype} but B is a pre-packed float32 matrix; "
                         "convert A with .astype(np.float32)")
    if not all(x.dtype.kind in "biufc" for x in (a, b)):
        raise DTypeError(f"matmul: no kernel for dtypes {a.dtype} @ {b.dtype}; "
                         "use numeric arrays (float32 is compiled)")
    pair = (str(a.dtype), str(b.dtype))
    if pair not in _noted:
        _noted.add(pair)
        log.info("matmul %s @ %s: no compiled kernel, running NumPy's matmul (extern)", *pair)
    _check_shapes(a, b)
    try:
        return np.matmul(a, b, out=out)
    except (TypeError, ValueError) as e:
        raise DTypeError(f"matmul: {e}; out must have the result's shape and a dtype the "
                         f"result ({np.result_type(a, b)}) can be cast to") from e


def _check_shapes(a, b) -> tuple[int, ...]:
    """np.matmul's shape rules; returns the broadcast batch shape."""
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must have at least 1 dimension, got shapes "
                         f"{a.shape} and {b.shape}; use * for scalars")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise ShapeError(f"matmul: A {a.shape} @ B {b.shape}: contraction sizes differ "
                         f"({ka} != {kb}); A's last dim must equal B's second-to-last")
    try:
        return np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ShapeError(f"matmul: A {a.shape} @ B {b.shape}: batch dims {a.shape[:-2]} and "
                         f"{b.shape[:-2]} do not broadcast") from None


def _plan(a, b, out, threads: int, packed: bool, src: str):
    """Validate once per (shapes, strides, out layout, threads); returns the cached entry:
    (plan, out shape, then the 2-D views of A, B, C the kernel runs on: None where the array
    already has that shape, and K)."""
    batch = _check_shapes(a, b)
    m = a.shape[-2] if a.ndim >= 2 else 1
    n = b.shape[-1] if b.ndim >= 2 else 1
    k = a.shape[-1]
    out_shape = (*batch, *((m,) if a.ndim >= 2 else ()), *((n,) if b.ndim >= 2 else ()))
    c_shape = (*batch, m, n)
    a_shape = a.shape if a.ndim >= 2 else (1, k)
    b_shape = b.shape if b.ndim >= 2 else (k, 1)
    if out is not None:
        if out.shape != out_shape:
            raise ShapeError(f"matmul: A {a.shape} @ B {b.shape} gives shape {out_shape}, but "
                             f"out has shape {out.shape}; allocate out with the result's shape")
        if out.dtype != _F32:
            raise DTypeError(f"matmul: out must be float32 like the result, got {out.dtype}")
    views = (None if a.shape == a_shape else a_shape, None if b.shape == b_shape else b_shape,
             None if out_shape == c_shape else c_shape)
    if m * n * math.prod(batch) == 0 or k == 0:
        return None, out_shape, *views, k
    if out is None:
        c = _Layout(c_shape, _contiguous_strides(c_shape))
    else:
        c = out.reshape(c_shape) if out.shape != c_shape else out
        if c.strides[-1] != 4:
            return _COPY, out_shape, *views, k
    a2 = a.reshape(a_shape) if a.shape != a_shape else a
    module = _module(src)
    if packed:
        if (b.module.target, b.module.kernel) != (module.target, module.kernel):
            raise UnsupportedError(f"matmul: {b!r} was packed for another target; re-pack it")
        b2 = b
    else:
        b2 = b.reshape(b_shape) if b.shape != b_shape else b
    plan = make_plan(module, a2, b2, c, 0, threads)
    return plan, out_shape, *views, k


class _Layout:
    """Shape and strides of a result not allocated yet (all a plan needs to know of C)."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...]):
        self.shape = shape
        self.strides = strides


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 4
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _overlaps(out: np.ndarray, x: np.ndarray) -> bool:
    return np.may_share_memory(out, x) and np.shares_memory(out, x, max_work=10_000)


def _allocate(shape, a, b) -> np.ndarray:
    try:
        return np.empty(shape, np.float32)
    except (MemoryError, ValueError) as e:
        nbytes = 4 * math.prod(shape)
        raise ShapeError(f"matmul: A {a.shape} @ B {b.shape} needs a result of shape {shape} "
                         f"({nbytes / 2**30:.1f} GiB), which cannot be allocated; split the "
                         "product or pass a preallocated out") from e
