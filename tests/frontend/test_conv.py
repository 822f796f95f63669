"""Convolutions with non-overlapping windows lower to patches @ weight^T; others stay PyTorch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frontend_helpers import check, lower

from tilefold.errors import UnsupportedError
from tilefold.frontend import report


@pytest.mark.parametrize("kernel, bias", [(4, True), (2, False), (1, True)])
def test_patch_convolution_matches_pytorch(kernel, bias):
    torch.manual_seed(kernel)
    x = torch.randn(2, 3, 8, 12)
    w = torch.randn(5, 3, kernel, kernel)
    b = torch.randn(5) if bias else None
    module = check(lambda x: F.conv2d(x, w, b, stride=kernel), x, atol=1e-4)
    assert "matmul" in {op.name for op in module.walk()}


def test_overlapping_convolution_is_refused_with_its_reason():
    w = torch.randn(4, 3, 3, 3)
    with pytest.raises(UnsupportedError, match="convolution with padding"):
        lower(lambda x: F.conv2d(x, w, padding=1), torch.randn(1, 3, 8, 8))


def test_patch_embedding_runs_native_through_torch_compile():
    """A ViT patch embedding compiles to one fused GEMM with its bias."""
    torch._dynamo.reset()
    report.REPORTS.clear()
    conv = torch.nn.Conv2d(3, 16, kernel_size=4, stride=4).eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(conv, backend="tilefold", options={"strict": True})
    with torch.no_grad():
        got, want = compiled(x), conv(x)
    assert got.shape == want.shape and (got - want).abs().max().item() < 1e-4
    (graph,) = report.reports()
    assert graph.mode == "tilefold"
    methods = {d.winner.method for r in graph.executors for d in r.runner.run.decisions()}
    assert "blocks.gemm" in methods
