"""scaled_dot_product_attention's reference on empty dims, against NumPy and PyTorch's answer:
no features makes every score 0 (a plain mean of v); no keys gives zeros."""

from __future__ import annotations

import numpy as np
from ir_oracle import run_op

RNG = np.random.default_rng(3)


def test_no_features_averages_the_values():
    q, k = np.zeros((2, 3, 0)), np.zeros((2, 4, 0))
    v = RNG.standard_normal((2, 4, 5))
    got = run_op("scaled_dot_product_attention", q, k, v)
    np.testing.assert_allclose(got, np.broadcast_to(v.mean(1, keepdims=True), (2, 3, 5)),
                               rtol=1e-15)


def test_no_keys_gives_zeros():
    q = RNG.standard_normal((2, 3, 6))
    k, v = np.zeros((2, 0, 6)), np.zeros((2, 0, 5))
    got = run_op("scaled_dot_product_attention", q, k, v)
    assert got.shape == (2, 3, 5) and not np.any(got)
