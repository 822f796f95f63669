"""Helpers shared by op declarations: dtype checks and low-precision-aware NumPy evaluation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tilefold import dtypes
from tilefold.dtypes import DType
from tilefold.errors import DTypeError
from tilefold.ir.types import TensorType


def widen(a: np.ndarray) -> np.ndarray:
    """The array in the precision the reference computes in: every float in f64.

    The oracle evaluates float math in f64 and rounds once to the result dtype, so it is at
    least as accurate as any compiled kernel it judges.
    """
    a = np.asarray(a)
    return a.astype(np.float64) if dtypes.dtype(a.dtype).is_float else a


def evaluate(fn: Callable[..., np.ndarray], args: list[np.ndarray], out: DType) -> np.ndarray:
    """Apply `fn` to widened inputs with floating-point warnings off, then round to `out`."""
    with np.errstate(all="ignore"):
        result = fn(*(widen(a) for a in args))
    return np.asarray(result).astype(out.np_dtype, copy=False)


def same_dtype(op: str, types: list[TensorType]) -> DType:
    kinds = {t.dtype for t in types}
    if len(kinds) != 1:
        listed = ", ".join(str(t) for t in types)
        raise DTypeError(f"{op}: operands must share one dtype, got {listed}; insert a cast")
    return kinds.pop()


def require_float(op: str, t: TensorType) -> None:
    if not t.dtype.is_float:
        raise DTypeError(f"{op}: needs a floating-point operand, got {t}; cast it to f32 first")
