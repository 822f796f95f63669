"""Helpers for op declarations: dtype checks, evaluation in wide precision rounded once."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from tilefold import dtypes
from tilefold.dtypes import DType
from tilefold.errors import DTypeError
from tilefold.ir.types import TensorType

_NATIVE_FLOATS = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16))


def widen(a: np.ndarray) -> np.ndarray:
    """The array in the precision the reference computes in: floats in f64, integers in i64.

    The oracle evaluates in f64 and rounds once to the result dtype, so it is at least as accurate
    as any compiled kernel it judges; integers wrap once, at the end, like two's complement.
    """
    a = np.asarray(a)
    dt = dtypes.dtype(a.dtype)
    if dt.is_float:
        return a.astype(np.float64)
    return a.astype(np.int64) if dt.is_integer else a


def round_to(x: np.ndarray, out: DType) -> np.ndarray:
    """`x` converted to `out`, float results rounded once to nearest even.

    NumPy rounds f64 to f32/f16 directly, but ml_dtypes converts f64 to bf16/fp8/fp4 through f32,
    which can round twice. Rounding to f32 *to odd* first keeps the second rounding exact.
    """
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        if not (out.is_float and x.dtype == np.float64 and out.np_dtype not in _NATIVE_FLOATS):
            return x.astype(out.np_dtype, copy=False)
        t = x.astype(np.float32)
        wide = t.astype(np.float64)
        inexact = (wide != x) & ~np.isnan(x)
        t = np.where(inexact & (np.abs(wide) > np.abs(x)), np.nextafter(t, np.float32(0)), t)
        odd = t.view(np.uint32) | inexact.astype(np.uint32)
        return odd.view(np.float32).astype(out.np_dtype)


def int_range(dt: DType) -> tuple[int, int]:
    """The smallest and largest value of integer dtype `dt`."""
    signed = dt.kind == "int"
    return (-(2 ** (dt.bits - 1)) if signed else 0), 2 ** (dt.bits - signed) - 1


def evaluate(fn: Callable[..., np.ndarray], args: list[np.ndarray], out: DType) -> np.ndarray:
    """Apply `fn` to widened inputs with floating-point warnings off, then round to `out`.

    NaN, inf and empty reductions are defined results here, not events worth a warning.
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = fn(*(widen(a) for a in args))
    return round_to(result, out)


def same_dtype(op: str, types: list[TensorType]) -> DType:
    kinds = {t.dtype for t in types}
    if len(kinds) != 1:
        listed = ", ".join(str(t) for t in types)
        raise DTypeError(f"{op}: operands must share one dtype, got {listed}; insert a cast")
    return kinds.pop()


# What an operand may be: the test, how the error names it, and what to do instead.
_ACCEPTS = {
    "float": (lambda d: d.is_float, "a floating-point operand", "cast it to f32 first"),
    "numeric": (lambda d: d.kind != "bool", "a numeric operand", "cast it to i32 or f32 first"),
    "bool": (lambda d: d.kind == "bool", "bool operands", "compare first (ne with 0)"),
    "any": (lambda d: True, "", ""),
}


def require(op: str, t: TensorType, accepts: str) -> None:
    """Raise DTypeError unless `t`'s dtype is of the kind `accepts` names (see _ACCEPTS)."""
    test, what, fix = _ACCEPTS[accepts]
    if not test(t.dtype):
        raise DTypeError(f"{op}: needs {what}, got {t}; {fix}")
