"""scaled_dot_product_attention's reference on empty dims, against NumPy and PyTorch's answer:
no features makes every score 0 (a plain mean of v); no keys gives zeros. attention_forward's
and attention_backward's against PyTorch (its output and log-sum-exp, its autograd), and their
shape errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ir_oracle import run_op

from tilefold.errors import ShapeError

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


def test_attention_backward_is_pytorchs_gradient():
    """With delta = <dout, out> and the rows' log-sum-exp, the gradients autograd gives for
    scaled_dot_product_attention with an additive mask (-inf entries included), in float64."""
    q, k, v = (torch.tensor(RNG.standard_normal(s), requires_grad=True)
               for s in ((2, 3, 11, 8), (2, 3, 13, 8), (2, 3, 13, 6)))
    mask = torch.tensor(np.where(RNG.random((2, 1, 11, 13)) > 0.2,
                                 RNG.standard_normal((2, 1, 11, 13)), -np.inf))
    mask[..., 0] = 0.0
    dout = torch.tensor(RNG.standard_normal((2, 3, 11, 6)))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = torch.autograd.grad(out, (q, k, v), dout)
    lse = torch.logsumexp(q @ k.transpose(-1, -2) / math.sqrt(8) + mask, -1)
    delta = (dout * out).sum(-1)
    args = [x.detach().numpy() for x in (dout, q, k, v, lse, delta, mask)]
    got = run_op("attention_backward", *args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-12)


def test_attention_backward_shape_errors_name_the_op():
    q, k = np.zeros((2, 5, 8)), np.zeros((2, 7, 8))
    rows = np.zeros((2, 5))
    with pytest.raises(ShapeError, match="attention_backward"):  # dout's features are not v's
        run_op("attention_backward", np.zeros((2, 5, 3)), q, k, np.zeros((2, 7, 4)), rows, rows)
    with pytest.raises(ShapeError, match="attention_backward"):  # a bias not of the scores
        run_op("attention_backward", q, q, k, k, rows, rows, np.zeros((2, 5, 6)))


def test_attention_forward_is_pytorchs_output_and_logsumexp():
    """A row the bias masks whole gives zeros and -inf (PyTorch's SDPA gives NaN there)."""
    q, k, v = (RNG.standard_normal(s) for s in ((2, 3, 11, 8), (2, 3, 13, 8), (2, 3, 13, 6)))
    bias = np.where(RNG.random((2, 1, 11, 13)) > 0.2, RNG.standard_normal((2, 1, 11, 13)),
                    -np.inf)
    bias[..., 0] = 0.0
    bias[1, 0, 4] = -np.inf
    out, lse = run_op("attention_forward", q, k, v, bias, scale=0.3)
    tq, tk, tv, tb = (torch.tensor(x) for x in (q, k, v, bias))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb, scale=0.3)
    want_lse = torch.logsumexp(tq @ tk.transpose(-1, -2) * 0.3 + tb, -1)
    kept = np.ones(out.shape[:-1], bool)
    kept[1, :, 4] = False
    np.testing.assert_allclose(out[kept], want.numpy()[kept], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse.numpy(), rtol=1e-12, atol=1e-12)
    assert not out[~kept].any() and (lse[~kept] == -np.inf).all()


def test_attention_forward_shape_errors_name_the_op():
    q, k = np.zeros((2, 5, 8)), np.zeros((2, 7, 8))
    with pytest.raises(ShapeError, match="attention_forward"):  # k and v lengths differ
        run_op("attention_forward", q, k, np.zeros((2, 6, 4)))
    with pytest.raises(ShapeError, match="attention_forward"):  # batch shapes differ (no GQA)
        run_op("attention_forward", q, np.zeros((1, 7, 8)), np.zeros((1, 7, 4)))
