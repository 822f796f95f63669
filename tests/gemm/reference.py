"""The oracle for GEMM tests: a float64 product and the one tolerance rule every test uses."""

from __future__ import annotations

import numpy as np


def check_matmul(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Assert `got` equals A @ B within fp32's rounding-error bound, elementwise.

    A length-K float32 dot product with any summation order (blocking, FMA) is within
    gamma_K * sum_k |a_k b_k| of the exact value, gamma_K = K u / (1 - K u), u = eps / 2
    (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). The bound is rigorous, so the
    test never flakes, yet a lost or doubled term (of size ~ sum / K) is far outside it.
    Non-finite entries must match NumPy's exactly (NaN where NumPy has NaN, same infinities).
    """
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ref = np.matmul(a64, b64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == np.float32
    k = a64.shape[-1]
    u = np.finfo(np.float32).eps / 2
    gamma = k * u / (1 - k * u) + u  # + u: the final rounding to float32
    bound = gamma * np.matmul(np.abs(a64), np.abs(b64)) + np.finfo(np.float32).tiny
    finite = np.isfinite(ref)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), "NaN pattern differs from NumPy's"
    assert np.array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
    err = np.abs(got[finite] - ref[finite])
    assert np.all(err <= bound[finite]), f"max error {err.max()} exceeds the fp32 bound"
