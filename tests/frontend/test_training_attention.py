"""Attention in a compiled training step: the gradients of query, key and value against
PyTorch's in float64 (float and bool masks, causal, grouped-query heads, L != S), strict, and
what the forward keeps for the backward: one log-sum-exp per query row, never the L x S
probabilities (`frontend/training_attention.py`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.tolerances import assert_close
from tilefold.frontend import report
from tilefold.frontend.training import saved_tensors

CASES = [  # (batch, heads, kv heads, L, S, head dim), mask, causal
    ((2, 4, 4, 24, 24, 8), "float", False),
    ((2, 4, 2, 5, 37, 8), "bool", False),
    ((1, 2, 2, 19, 19, 16), None, True),
    ((2, 6, 2, 13, 13, 8), "float", True),
]


def _inputs(shape, mask_kind, dtype=torch.float64):
    b, h, hk, n_q, n_k, e = shape
    g = torch.Generator().manual_seed(sum(shape))
    q = torch.randn(b, h, n_q, e, generator=g, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, hk, n_k, e, generator=g, dtype=dtype, requires_grad=True)
            for _ in range(2))
    mask = None
    if mask_kind == "float":
        mask = torch.randn(b, 1, n_q, n_k, generator=g, dtype=dtype)
    elif mask_kind == "bool":
        mask = torch.rand(b, 1, n_q, n_k, generator=g) > 0.3
        mask[..., 0] = True  # no row masked whole
    return q, k, v, mask


@pytest.mark.parametrize("shape, mask_kind, causal", CASES)
def test_attention_gradients_match_pytorch(shape, mask_kind, causal, monkeypatch) -> None:
    monkeypatch.setenv("TILEFOLD_STRICT", "1")
    torch._dynamo.reset()
    q, k, v, mask = _inputs(shape, mask_kind)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=q.shape[1] != k.shape[1])

    grad = torch.randn((*q.shape[:-1], v.shape[-1]), dtype=q.dtype,
                       generator=torch.Generator().manual_seed(1))
    want_out = attend(q, k, v)
    want = torch.autograd.grad(want_out, (q, k, v), grad)
    got_out = torch.compile(attend, backend="tilefold")(q, k, v)
    got = torch.autograd.grad(got_out, (q, k, v), grad)
    reduced = shape[4] * shape[5]  # a row of scores, then of the output
    assert_close(got_out.detach(), want_out.detach(), dtype="f64", reduced=reduced)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, dtype="f64", reduced=reduced)


@pytest.mark.parametrize("shape, mask_kind, causal", CASES)
def test_float32_attention_is_the_fused_ops(shape, mask_kind, causal, monkeypatch) -> None:
    """In float32 the forward graph's attention is one `attention_forward` and the backward's
    one `attention_backward` (the fused kernels, strict), and the gradients are PyTorch's
    float64 ones within float32's tolerance."""
    monkeypatch.setenv("TILEFOLD_STRICT", "1")
    torch._dynamo.reset()
    q, k, v, mask = _inputs(shape, mask_kind)
    grad = torch.randn((*q.shape[:-1], v.shape[-1]), dtype=q.dtype,
                       generator=torch.Generator().manual_seed(1))

    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=q.shape[1] != k.shape[1])

    want = torch.autograd.grad(attend(q, k, v, mask), (q, k, v), grad)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    mask32 = mask if mask is None or mask.dtype == torch.bool else mask.float()
    report.REPORTS.clear()
    got = torch.autograd.grad(torch.compile(attend, backend="tilefold")(*leaves, mask32),
                              leaves, grad.float())
    fused = [op.name for g in report.reports() for e in g.executors
             for op in e.runner.run.compiled.function.ops if op.name.startswith("attention_")]
    assert fused == ["attention_forward", "attention_backward"]
    reduced = shape[4] * shape[5]
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, dtype="f32", reduced=reduced, scale=w.abs().max())


def test_the_forward_saves_no_probabilities(monkeypatch) -> None:
    monkeypatch.setenv("TILEFOLD_STRICT", "1")
    torch._dynamo.reset()
    q, k, v, mask = _inputs((2, 3, 3, 40, 40, 8), "float", torch.float32)
    out = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask).sum(), backend="tilefold")(q, k, v)
    shapes = {tuple(t.shape) for t in saved_tensors(out)}
    assert shapes, "nothing saved: the step did not run through the compiled backward"
    probabilities = [s for s in shapes - {tuple(mask.shape)} if s[-2:] == (40, 40)]
    assert not probabilities, shapes
