"""Running one op through the whole IR path, and the one tolerance the op tests compare with.

Tolerance, stated once: the reference interpreter computes in f64 and rounds once to the result
dtype. A test's closed form, also evaluated in f64, differs from it before that rounding by at most
its own f64 error, bounded here by 2**-40 times the inputs' scale. After rounding, the two differ
by at most one unit in the last place of the result dtype (at most eps * |expected|) plus that f64
error, plus the smallest subnormal for results that round to or near zero. Integer and bool
results compare exactly.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tilefold import dtypes
from tilefold.ir import Builder, interpret, parse_module, print_module, verify

F64_ERROR = 2.0**-40


def run_op(name: str, *inputs: np.ndarray, **attrs) -> np.ndarray | list[np.ndarray]:
    """Build a one-op function of `inputs`' types, round-trip it through text, interpret it."""
    arrays = [np.asarray(x) for x in inputs]
    b = Builder("main")
    args = [b.arg(f"a{i}", dtypes.dtype(a.dtype), a.shape) for i, a in enumerate(arrays)]
    out = b.op(name, *args, **attrs)
    outs = out if isinstance(out, list) else [out]
    module = b.build(*outs)
    text = print_module(module)
    parsed = verify(parse_module(text))
    assert print_module(parsed) == text
    results = interpret(parsed, *arrays)
    for result, declared in zip(results, outs, strict=True):
        assert result.dtype == declared.dtype.np_dtype
        assert result.shape == tuple(declared.shape)
    return results if isinstance(out, list) else results[0]


def assert_close(actual: np.ndarray, expected, scale: float = 1.0) -> None:
    """`actual` (any dtype) against an f64 `expected` within the tolerance of this module's
    docstring; NaNs must match NaNs and infinities must be equal."""
    actual = np.asarray(actual)
    dt = dtypes.dtype(actual.dtype)
    expected = np.broadcast_to(np.asarray(expected, np.float64), actual.shape)
    if not dt.is_float:
        np.testing.assert_array_equal(actual, expected.astype(actual.dtype))
        return
    info = ml_dtypes.finfo(dt.np_dtype)
    overflow = float(info.max) + 2.0 ** (info.maxexp - 2 - info.nmant)  # max + half an ulp
    with np.errstate(invalid="ignore"):
        expected = np.where(np.abs(expected) >= overflow, np.sign(expected) * np.inf, expected)
    got = actual.astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(expected)), (got, expected)
    finite = np.isfinite(expected)
    assert np.array_equal(got[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(got)])
    tol = float(info.eps) * np.abs(expected) + F64_ERROR * scale + float(info.smallest_subnormal)
    err = np.abs(got - expected)
    bad = finite & ~(err <= tol)
    assert not bad.any(), (
        f"{dt}: max error {err[bad].max()} at {np.argwhere(bad)[0]}: "
        f"got {got[bad][:4]}, expected {expected[bad][:4]}"
    )


def round_once(x: np.ndarray, dt: dtypes.DType) -> np.ndarray:
    """`x` (f64) rounded to the nearest value of float dtype `dt`, ties to even: an independent
    check of the oracle's rounding that compares the neighbouring codes exactly in f64.

    For the 8- and 16-bit ml_dtypes floats (bf16, fp8e4m3); NumPy rounds to f64/f32/f16 directly.
    """
    x = np.asarray(x, np.float64)
    nearest = x.astype(dt.np_dtype)
    if dt.np_dtype in (np.float64, np.float32, np.float16) or dt.bits < 8:
        return nearest
    code = np.dtype(f"u{dt.itemsize}")
    best = nearest
    for step in (-1, 1):
        other = (best.view(code).astype(np.int64) + step) % 2**dt.bits
        other = other.astype(code).view(dt.np_dtype)
        d_best = np.abs(best.astype(np.float64) - x)
        d_other = np.abs(other.astype(np.float64) - x)
        even = other.view(code) % 2 == 0
        closer = (d_other < d_best) | ((d_other == d_best) & even)
        best = np.where(np.isfinite(other.astype(np.float64)) & closer, other, best)
    return best
