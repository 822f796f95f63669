"""The graph cache: a warm torch.compile skips AOTAutograd, binds its own model's weights, and
stores only graphs that need none of AOTAutograd's runtime wrapping."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F

from tilefold.frontend import report


class Net(torch.nn.Module):
    def __init__(self, alias_output: bool = False):
        super().__init__()
        self.proj = torch.nn.Linear(24, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.alias_output = alias_output

    def forward(self, x):
        y = F.gelu(self.norm(self.proj(x))) * 2
        return (y, x.view(-1)) if self.alias_output else y


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    report.REPORTS.clear()
    return tmp_path


def _compile_and_check(model: torch.nn.Module, x: torch.Tensor) -> report.GraphReport:
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="tilefold")(x)
        want = model(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    return report.reports()[-1]


def _no_aot(monkeypatch):
    """Make any use of AOTAutograd fail: a cache hit must not trace."""
    import torch._dynamo.backends.common as common

    def refuse(*args, **kwargs):
        raise AssertionError("AOTAutograd ran on a cache hit")

    monkeypatch.setattr(common, "aot_autograd", refuse)


def test_a_warm_compile_skips_the_trace_and_matches_eager(private_cache, monkeypatch):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    assert not _compile_and_check(model, x).cached
    assert len(list((private_cache / "graphs").glob("*.json"))) == 1
    _no_aot(monkeypatch)
    assert _compile_and_check(model, x).cached


def test_a_hit_binds_the_weights_of_the_model_it_compiles():
    """Same architecture, other weights: the stored text holds names, not values."""
    torch.manual_seed(0)
    x = torch.randn(3, 24)
    _compile_and_check(Net().eval(), x)
    torch.manual_seed(1)
    other = Net().eval()
    assert _compile_and_check(other, x).cached  # checked against `other` in eager


def test_weights_changed_in_place_after_a_hit_are_lowered_again():
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    _compile_and_check(model, x)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, backend="tilefold")
        compiled(x)
        assert report.reports()[-1].cached
        model.proj.weight.mul_(-0.5)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_corrupt_entry_is_reported_and_lowered_afresh(private_cache, caplog):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    _compile_and_check(model, x)
    (entry,) = (private_cache / "graphs").glob("*.json")
    entry.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="tilefold.frontend"):
        assert not _compile_and_check(model, x).cached
    assert "ignoring the stored graph" in caplog.text


def test_graphs_returning_an_alias_of_an_input_are_not_stored(private_cache):
    """Their outputs need AOTAutograd's wrapper (it regenerates the view)."""
    torch.manual_seed(0)
    model, x = Net(alias_output=True).eval(), torch.randn(3, 24)
    torch._dynamo.reset()
    with torch.no_grad():
        got, view = torch.compile(model, backend="tilefold")(x)
        want, _ = model(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert view.data_ptr() == x.data_ptr()
    assert not list((private_cache / "graphs").glob("*.json"))


def test_the_cache_can_be_turned_off(private_cache, monkeypatch):
    monkeypatch.setenv("TILEFOLD_GRAPH_CACHE", "0")
    torch.manual_seed(0)
    _compile_and_check(Net().eval(), torch.randn(3, 24))
    assert not (private_cache / "graphs").exists()


def test_write_mode_lowers_afresh_and_stores(private_cache, monkeypatch):
    """How the demo times a cold compile while leaving the cache warm for the next one."""
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 24)
    _compile_and_check(model, x)
    (entry,) = (private_cache / "graphs").glob("*.json")
    entry.unlink()
    monkeypatch.setenv("TILEFOLD_GRAPH_CACHE", "write")
    assert not _compile_and_check(model, x).cached
    assert entry.exists()
    monkeypatch.delenv("TILEFOLD_GRAPH_CACHE")
    assert _compile_and_check(model, x).cached


class Cache(torch.nn.Module):
    """A static cache written in place at a position, then read whole (a decode step's state)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("cache", torch.zeros(5, 8))

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.proj(x))
        return torch.tanh(self.cache).sum(0)


def test_graphs_writing_their_state_in_place_are_stored_and_write_it_on_a_hit(private_cache,
                                                                              monkeypatch):
    """The mutation stays in the graph (`keep_inference_input_mutations`): a hit skips
    AOTAutograd and the runner still lands every write in the caller's buffer."""
    torch.manual_seed(0)
    xs = [torch.randn(1, 8) for _ in range(4)]
    for hit in (False, True):
        model, twin = Cache().eval(), Cache().eval()
        twin.load_state_dict(model.state_dict())
        torch._dynamo.reset()
        if hit:
            _no_aot(monkeypatch)
        with torch.no_grad():
            compiled = torch.compile(model, backend="tilefold")
            for i, x in enumerate(xs):
                pos = torch.tensor([i])
                torch.testing.assert_close(compiled(x, pos), twin(x, pos), atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(model.cache, twin.cache, atol=1e-6, rtol=1e-6)
        assert report.reports()[-1].cached == hit
        assert len(list((private_cache / "graphs").glob("*.json"))) == 1


def test_an_optimizer_steps_attributes_are_inputs_of_its_stored_graph(private_cache,
                                                                      monkeypatch):
    """Dynamo hands `opt.step`'s parameters and state to the backend as graph attributes,
    which AOTAutograd lifts into inputs: the key covers them, and a hit (no AOTAutograd)
    passes them first and updates them in place, step for step as eager's optimizer."""
    for hit in (False, True):
        _adamw_steps(monkeypatch, hit, steps=3, shapes=((5, 3), (7,), ()), strict=True)
    assert len(list((private_cache / "graphs").glob("*.json"))) >= 1


def _adamw_steps(monkeypatch, hit: bool, steps: int = 2, shapes=((6, 4), (4,)),
                 strict: bool | None = None) -> None:
    """`steps` compiled AdamW steps of parameters of `shapes` (a graph with no frozen weight),
    each checked against eager's; `hit`: AOTAutograd refused, as a cache hit must not need
    it."""
    g = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = torch.optim.AdamW(ours, lr=1e-2, weight_decay=0.1)
    eager = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1)
    torch._dynamo.reset()
    if hit:
        _no_aot(monkeypatch)
    step = torch.compile(opt.step, backend="tilefold", options={"strict": strict})
    for _ in range(steps):
        for p, q in zip(ours, theirs, strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        step()
        eager.step()
        for p, q in zip(ours, theirs, strict=True):
            torch.testing.assert_close(p.detach(), q.detach(), atol=1e-5, rtol=1e-5)
    assert any(r.cached for r in report.reports()) == hit


def _entries(cache) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cache / "graphs").glob("*.json"))]


def test_a_graph_without_frozen_weights_is_stored_optimized_and_a_hit_runs_no_pass(
        private_cache, monkeypatch):
    """The AdamW step's graph (every tensor an argument) is stored as the pass pipeline's
    module, fused groups and all; a hit compiles it without running a pass."""
    _adamw_steps(monkeypatch, hit=False)
    (entry,) = [e for e in _entries(private_cache) if "text" in e]
    assert entry["optimized"] and not entry["frozen"]
    assert " = fused(" in entry["text"]
    from tilefold.passes import PassManager

    def refuse(*args, **kwargs):
        raise AssertionError("a pass ran on an optimized hit")

    monkeypatch.setattr(PassManager, "run", refuse)
    _adamw_steps(monkeypatch, hit=True)


def test_a_graph_with_frozen_weights_keeps_the_lowered_module(private_cache):
    """Passes make constants of frozen weights (folded, quantized) that the text could not
    name: such graphs are stored before the pipeline, and run it on a hit."""
    torch.manual_seed(0)
    _compile_and_check(Net().eval(), torch.randn(3, 24))
    (entry,) = _entries(private_cache)
    assert entry["frozen"] and not entry["optimized"]
    assert " = fused(" not in entry["text"]


def test_a_corrupt_optimized_entry_is_reported_and_lowered_afresh(private_cache, monkeypatch,
                                                                   caplog, allow_fallback):
    _adamw_steps(monkeypatch, hit=False)
    (path,) = [p for p in (private_cache / "graphs").glob("*.json")
               if "text" in json.loads(p.read_text())]
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "text": entry["text"].replace("fused", "fusd")}))
    report.REPORTS.clear()
    with caplog.at_level(logging.WARNING, logger="tilefold.frontend"):
        _adamw_steps(monkeypatch, hit=False)  # (AOTAutograd traces again)
    assert "the cached lowering failed" in caplog.text


def test_an_optimized_hit_falls_back_to_interpreting_the_stored_module(private_cache,
                                                                        monkeypatch, caplog,
                                                                        allow_fallback):
    """Outside strict mode, a compiled graph that fails hands the stored (fused) module to
    the reference interpreter, which runs it to the same answers."""
    _adamw_steps(monkeypatch, hit=False)
    from tilefold.compiler import CompiledGraph

    def fail(*args, **kwargs):
        raise RuntimeError("a kernel failed")

    monkeypatch.setattr(CompiledGraph, "__call__", fail)
    with caplog.at_level(logging.WARNING, logger="tilefold.frontend"):
        _adamw_steps(monkeypatch, hit=True)
    assert "running on the reference interpreter" in caplog.text


def test_the_key_covers_the_passes_and_the_weights_format(monkeypatch):
    """A stored optimized module is what these passes made: other pass sources or another
    pipeline (a weights format) is another key."""
    from tilefold.frontend import graph_cache

    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) * 2)
    inputs = [torch.randn(3)]
    key = graph_cache.graph_key(gm, inputs)
    assert graph_cache.graph_key(gm, inputs) == key
    assert graph_cache.graph_key(gm, inputs, weights="int8") != key
    digest = graph_cache.source_digest
    monkeypatch.setattr(graph_cache, "source_digest", lambda *modules: digest(*modules) + (
        "changed" if modules == graph_cache._PASSES else ""))
    assert graph_cache.graph_key(gm, inputs) != key
