"""How far a tilefold result may sit from its float64 oracle: one rule for every test.

For a result of `dtype` whose every element comes from sums of at most `reduced` terms (a
reduction's length along its reduced axes, a GEMM's K; 1 for elementwise math) of size about
`scale` (default 1: unit-sized inputs), the rule is

    eps = 2 u(dtype) + (16 + 4 reduced) u(acc)     u = unit roundoff: 2**-24 for f32, 2**-8 bf16
    |got - want| <= eps |want| + eps max(1, scale)  acc = f64 for f64 results, f32 otherwise

- 2 u(dtype): the result's own rounding (half an ulp, and a second one when an f32 value is
  rounded to bf16/f16), against an oracle that was never rounded.
- 16 u(acc): elementwise math within 5 ulp (`vecmath.ULP_BOUNDS`) and a few roundings.
- 4 reduced u(acc): a sum of n terms. Its n roundings add up like a random walk: for terms of
  both signs about n u scale / sqrt(2) even summed one after another (less with tilefold's
  vector accumulators); for terms of one sign about sqrt(n / 3) u of the sum. 4 n u, absolute
  per unit of scale and relative, covers both with a margin of 5 or more, so a test does not
  flake, yet stays below one term while 4 n u < 1 (n < 2**22 in f32): a lost, doubled or
  misplaced term fails.

It grows with the reduced length only, never with the size of the tensor.
Integer and bool results must be exact.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tilefold import dtypes


def unit_roundoff(dtype) -> float:
    """Half the distance from 1 to the next value of `dtype` (0 for integers and bool)."""
    dt = dtypes.dtype(dtype)
    return float(ml_dtypes.finfo(dt.np_dtype).eps) / 2 if dt.is_float else 0.0


def tolerance(dtype="f32", reduced: int = 1, scale: float = 1.0) -> dict[str, float]:
    """`rtol` and `atol` of the rule above, for `np.testing.assert_allclose`."""
    u = unit_roundoff(dtype)
    acc = unit_roundoff("f64" if dtypes.dtype(dtype) == dtypes.f64 else "f32") if u else 0.0
    eps = 2 * u + (16 + 4 * reduced) * acc
    return {"rtol": eps, "atol": eps * max(1.0, scale)}


def assert_close(actual, expected, *, dtype, reduced: int = 1, scale=None) -> None:
    """Check `actual` (any float dtype) against `expected` (float64) by the rule above.

    `scale` may be an array that broadcasts to `expected`: the size of each element's terms.
    NaN must meet NaN and infinities must match exactly.
    """
    got = np.asarray(actual).astype(np.float64)
    want = np.asarray(expected, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    eps = tolerance(dtype, reduced)["rtol"]
    size = np.maximum(1.0, 1.0 if scale is None else np.asarray(scale, np.float64))
    bound = eps * np.abs(want) + eps * size
    with np.errstate(invalid="ignore"):  # inf - inf
        error = np.abs(got - want)
    exact = (got == want) | (np.isnan(got) & np.isnan(want))
    ok = np.where(np.isfinite(want), error <= bound, exact)
    if not ok.all():
        error = np.where(ok, -1.0, np.nan_to_num(error, nan=np.inf))
        worst = np.unravel_index(np.argmax(error), ok.shape)
        raise AssertionError(
            f"{(~ok).sum()} of {ok.size} elements are off by more than the {dtype} tolerance "
            f"for sums of {reduced} (eps = {eps:.3g}); worst at {tuple(map(int, worst))}: "
            f"got {float(got[worst])!r}, expected {float(want[worst])!r}, allowed "
            f"{float(np.broadcast_to(bound, ok.shape)[worst]):.3g}")
