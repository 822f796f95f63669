"""The lowering rules a training step's backward graph needs beyond the forward's: `any` over
dims (the math attention's fully-masked-row test) and `empty*` (a buffer autograd fills with
full_like), each against float64 NumPy on random inputs."""

from __future__ import annotations

import numpy as np
import torch
from frontend_helpers import lower

from tilefold.ir import interpret


def test_any_over_dims_matches_numpy() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5))
    x[rng.random(x.shape) < 0.6] = 0.0
    x[1, 2] = 0.0  # a row with no nonzero element
    module = lower(lambda t: (torch.any(t, dim=2), torch.any(t, dim=(0, 2), keepdim=True),
                              torch.any(t)), torch.from_numpy(x).float())
    got = interpret(module, x.astype(np.float32))
    nonzero = x != 0
    want = (nonzero.any(2), nonzero.any((0, 2), keepdims=True), nonzero.any())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.bool_
        np.testing.assert_array_equal(g, w)


def test_a_filled_empty_tensor_matches_numpy() -> None:
    x = np.random.default_rng(8).standard_normal((4, 6)).astype(np.float32)

    def fill(t):
        return torch.full_like(torch.empty_like(t), 2.5) * t + torch.empty(4, 6).fill_(1.5)

    (got,) = interpret(lower(fill, torch.from_numpy(x)), x)
    np.testing.assert_allclose(got, 2.5 * x.astype(np.float64) + 1.5, rtol=1e-6, atol=1e-6)
