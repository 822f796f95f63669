"""softplus through torch.compile(backend="tilefold") in strict mode: kept whole by the
decomposition, lowered by its ATen rule, run by native kernels (memory-bound and a GEMM
epilogue), against float64 PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frontend_helpers import assert_native

from tilefold.frontend import report


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    report.REPORTS.clear()
    torch.manual_seed(15)


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(24, 40)

    def forward(self, x):
        h = F.softplus(self.linear(x))  # a GEMM epilogue
        return F.softplus(x, beta=2.0, threshold=5.0).sum(-1, keepdim=True) + h


def test_softplus_runs_natively_and_matches_float64():
    model = Head().eval()
    x = torch.randn(3, 7, 24) * 30  # large |x|: both tails and the linear region
    compiled = torch.compile(model, backend="tilefold", options={"strict": True})
    with torch.no_grad():
        got = compiled(x)
        want = model.double()(x.double())
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=2e-6 * want.abs().max())
    (graph,) = report.reports()
    assert graph.mode == "tilefold" and not graph.fallback
    assert graph.lowered.get("aten.softplus.default") == 2  # not decomposed
    assert_native([graph], {"matmul"})
    methods = {method for names, method in graph.groups() if "softplus" in names.split("+")}
    assert methods and methods <= {"blocks.gemm", "autocodegen.kernel"}, graph.groups()
