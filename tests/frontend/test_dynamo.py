"""torch.compile(backend="tilefold"): partitioning, fallbacks, frozen weights, dynamic shapes."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from frontend_helpers import assert_native

from tilefold import FallbackError  # the public re-export of tilefold.errors.FallbackError
from tilefold.frontend import report


class Block(torch.nn.Module):
    def __init__(self, odd_op: bool = False):
        super().__init__()
        self.proj = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.odd_op = odd_op

    def forward(self, x):
        q = self.norm(self.proj(x)).view(x.shape[0], x.shape[1], 2, 16).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        if self.odd_op:
            o = torch.cumprod(o, -1)  # no tilefold rule: runs in PyTorch
        return F.gelu(o).softmax(-1)


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    report.REPORTS.clear()
    torch.manual_seed(0)


def test_backend_is_registered_by_name():
    import torch._dynamo

    assert "tilefold" in torch._dynamo.list_backends()


def test_whole_graph_runs_in_tilefold_and_matches_eager():
    model = Block().eval()
    compiled = torch.compile(model, backend="tilefold")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    (graph,) = report.reports()
    assert graph.mode == "tilefold" and not graph.fallback
    assert graph.lowered.get("tilefold.sdpa.default") == 1  # attention kept whole
    assert_native([graph], {"matmul", "scaled_dot_product_attention", "layer_norm"})


def test_unsupported_op_is_partitioned_out_and_explained(caplog, allow_fallback):
    model = Block(odd_op=True).eval()
    compiled = torch.compile(model, backend="tilefold")
    x = torch.randn(2, 5, 16)
    with caplog.at_level(logging.INFO, logger="tilefold.frontend"), torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    (graph,) = report.reports()
    assert graph.mode == "partitioned" and graph.partitions == 2
    assert "aten.cumprod.default" in graph.fallback
    assert "PyTorch runs aten.cumprod.default" in report.explain()
    assert any("cumprod" in r.message for r in caplog.records)


def test_partitions_freeze_weights_and_follow_in_place_updates(allow_fallback):
    """Weights feeding a tilefold partition are constants (the GEMM packs them once), as in a
    whole graph, and an in-place update lowers the partitions again."""
    model = Block(odd_op=True).eval()
    compiled = torch.compile(model, backend="tilefold")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        compiled(x)
        (graph,) = report.reports()
        assert graph.mode == "partitioned"
        gemms = [d.winner.key for d in graph.decisions() if "matmul" in d.problem.names]
        assert gemms and all('"prepack":true' in k for k in gemms), gemms
        model.proj.weight.mul_(-2)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_partitions_stop_pytorch_openmp_workers_first(monkeypatch, allow_fallback):
    """PyTorch's OpenMP workers spin after the ops it runs; each tilefold partition stops them
    before its kernels start (they cost the next GEMM about 10 ms)."""
    from tilefold.frontend import openmp

    assert openmp._pause_function() is not None  # the OpenMP runtime PyTorch ships
    calls = []
    monkeypatch.setattr(openmp, "pause_workers", lambda: calls.append(1))
    model = Block(odd_op=True).eval()
    compiled = torch.compile(model, backend="tilefold")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        compiled(x)
        calls.clear()
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert len(calls) == report.reports()[0].partitions


def test_autograd_compiles_forward_and_backward_graphs():
    """With autograd on, AOTAutograd's forward and backward graphs both run in tilefold (the
    numbers are checked against float64 in test_training.py)."""
    model = Block()
    compiled = torch.compile(model, backend="tilefold")
    x = torch.randn(2, 5, 16)
    compiled(x).sum().backward()
    got = model.proj.weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    torch.testing.assert_close(got, model.proj.weight.grad, atol=1e-4, rtol=1e-4)
    graphs = report.reports()
    assert [g.graph.split()[-1] for g in graphs] == ["forward", "backward"]
    assert all(g.mode == "tilefold" for g in graphs), [g.format() for g in graphs]


def test_new_sequence_lengths_reuse_the_symbolic_graph():
    model = Block().eval()
    compiled = torch.compile(model, backend="tilefold")
    with torch.no_grad():
        for seq in (5, 7, 9, 12):
            x = torch.randn(2, seq, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    graphs = report.reports()
    assert len(graphs) == 2  # static first, then one symbolic graph for every later length
    assert graphs[1].symbolic_dims
    assert_native(graphs, {"matmul", "scaled_dot_product_attention", "layer_norm"})


class FlatRows(torch.nn.Module):
    """OPT's decoder MLP: rows flattened to [batch*seq, H], normalized, projected, added back
    and returned flat; at a new length the flattened size is a product of symbols."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.rms = torch.nn.RMSNorm(16, eps=1e-6)

    def forward(self, x):
        flat = x.reshape(-1, x.size(-1))
        h = self.fc(self.norm(flat)).relu() + flat
        return torch.softmax(self.rms(h), -1), h


def _flat_rows_f64(model: FlatRows, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """FlatRows in float64 NumPy."""
    w = {k: v.detach().numpy().astype(np.float64) for k, v in model.state_dict().items()}
    flat = x.numpy().astype(np.float64).reshape(-1, 16)
    centered = flat - flat.mean(-1, keepdims=True)
    normed = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5)
    normed = normed * w["norm.weight"] + w["norm.bias"]
    h = np.maximum(normed @ w["fc.weight"].T + w["fc.bias"], 0) + flat
    r = h / np.sqrt((h**2).mean(-1, keepdims=True) + 1e-6) * w["rms.weight"]
    e = np.exp(r - r.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), h


def test_rows_flattened_from_symbolic_dims_normalize_and_return_flat():
    """A view(-1, H) of [?b,?s,H] stays unflattened through layer_norm, RMSNorm, softmax and
    the residual add, and graph outputs of that size come back flattened as PyTorch has them."""
    model = FlatRows().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    compiled = torch.compile(model, backend="tilefold", options={"strict": True})
    with torch.no_grad():
        for seq in (5, 7, 9):
            x = torch.randn(2, seq, 16)
            got = compiled(x)
            for g, w in zip(got, _flat_rows_f64(model, x), strict=True):
                assert tuple(g.shape) == w.shape == (2 * seq, 16)
                np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)
    graphs = report.reports()
    assert len(graphs) == 2 and graphs[1].symbolic_dims
    assert_native(graphs, {"matmul", "layer_norm", "rsqrt"})  # RMSNorm arrives decomposed


def test_frozen_weights_follow_in_place_updates():
    model = Block().eval()
    compiled = torch.compile(model, backend="tilefold")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        compiled(x)
        model.proj.weight.mul_(2)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_strict_option_raises_instead_of_falling_back(allow_fallback):
    compiled = torch.compile(Block(odd_op=True), backend="tilefold", options={"strict": True})
    with pytest.raises(Exception, match="cumprod") as info:
        compiled(torch.randn(2, 5, 16))
    assert isinstance(getattr(info.value, "inner_exception", None), FallbackError)


def test_strict_mode_names_the_nodes_pytorch_would_run():
    """Under TILEFOLD_STRICT (on for the suite) a graph tilefold would only partly run raises,
    naming the op; `strict=False` lets it run partitioned."""
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(Block(odd_op=True).eval(), backend="tilefold")
    with torch.no_grad(), pytest.raises(Exception, match=r"aten\.cumprod\.default") as info:
        compiled(x)
    assert isinstance(getattr(info.value, "inner_exception", None), FallbackError)
    torch._dynamo.reset()
    model = Block(odd_op=True).eval()
    lenient = torch.compile(model, backend="tilefold", options={"strict": False})
    with torch.no_grad():
        torch.testing.assert_close(lenient(x), model(x), atol=1e-5, rtol=1e-5)
    assert report.reports()[-1].mode == "partitioned"


def test_strict_mode_raises_when_the_interpreter_would_take_over(monkeypatch):
    """A compiled graph whose kernels fail at run time is an error under strict mode, naming the
    graph; without it the reference interpreter takes over and the report says so."""
    from tilefold.compiler import CompiledGraph

    def broken(self, *arrays):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(CompiledGraph, "__call__", broken)
    model = Block().eval()
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(model, backend="tilefold")
    failed = r"graph #\d+: the compiled graph failed.*kernel exploded"
    with torch.no_grad(), pytest.raises(FallbackError, match=failed):
        compiled(x)
    monkeypatch.delenv("TILEFOLD_STRICT")
    torch._dynamo.reset()
    report.REPORTS.clear()
    compiled = torch.compile(model, backend="tilefold")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    (graph,) = report.reports()
    assert graph.executor == "interpreter"
    assert graph.groups() and {m for _, m in graph.groups()} == {"interpreter"}


def test_graphs_of_one_model_share_its_weights_memory():
    """Every graph Dynamo makes of a model freezes a weight as the same array, on the weight's
    own memory (no copy per graph); a weight changed in place is frozen anew, with its new
    values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU()).eval()
    compiled = torch.compile(model, backend="tilefold", dynamic=False)

    def frozen():
        return [op.attrs["value"] for g in report.reports() for e in g.executors
                for op in e.runner.converted.module.walk()
                if op.name == "constant" and op.attrs["value"].shape == (96, 64)]

    with torch.no_grad():
        for rows in (3, 5):  # two static graphs
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x))
        first, second = frozen()
        assert first is second
        assert np.shares_memory(first, model[0].weight.detach().numpy())
        model[0].weight.mul_(2.0)
        x = torch.randn(3, 64)
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("odd_op", [False, True], ids=["whole", "partitioned"])
def test_a_report_keeps_no_compiled_graph_alive_after_a_reset(odd_op, allow_fallback):
    """The report (what `explain` prints) holds a graph's executors weakly: once Dynamo's
    cache is reset and the compiled module dropped, its plans and buffers are freed, and the
    report says so instead of naming an executor that is gone."""
    import gc
    import weakref

    compiled = torch.compile(Block(odd_op).eval(), backend="tilefold")
    with torch.no_grad():
        compiled(torch.randn(2, 8, 16))
    (graph,) = report.reports()
    assert graph.executors and graph.executor == "tilefold.compile"
    runs = [weakref.ref(e.runner.run) for e in graph.executors]
    del compiled
    torch._dynamo.reset()
    gc.collect()
    assert all(r() is None for r in runs)
    assert graph.executors == [] and graph.executor == "released"
    assert "executor released" in report.explain()
