"""The training graph cache (`frontend/training_cache.py`): a new process with the same cache
trains without AOTAutograd's trace, and its steps are exactly the cold process's (which match
float64 eager); a model with another shape or another requires_grad pattern misses.

Each process is a subprocess (`_TRAIN`): the cold one compiles and stores, the warm one runs
with AOTAutograd's tracing made to fail, so a step that traced would raise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from tolerances import assert_close, tolerance

_TRAIN = r'''
import copy, json, sys
import torch
import torch.nn.functional as F
from tilefold.frontend import report

warm, graph, strict = sys.argv[1] == "warm", sys.argv[2], sys.argv[3] == "1"
dropout, view = graph == "dropout", graph == "view"
if warm:  # a hit must not trace: AOTAutograd's first two stages raise
    import torch._functorch.aot_autograd as aot

    def refuse(*args, **kwargs):
        raise RuntimeError("AOTAutograd traced")

    aot.create_aot_state = aot.aot_stage1_graph_capture = refuse


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
        self.norm, self.head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)

    def forward(self, ids, labels):
        x = self.emb(ids)
        h = F.gelu(self.fc1(x))
        if dropout:  # a random op: its seed is drawn at each call, hit or miss
            h = F.dropout(h, 0.25)
        h = self.norm(self.fc2(h) + x)
        logits = self.head(h.mean(1))
        if view:  # the only view of an intermediate (`unsafe_view_alias`), one the backward
            squashed = torch.tanh(logits)  # reads too: the forward returns it as a view of
            return F.cross_entropy(squashed, labels), squashed.view(-1)  # a saved tensor
        return F.cross_entropy(logits, labels), logits > 0  # a non-differentiable output


torch.manual_seed(0)
model = Net()
oracle = copy.deepcopy(model).double()
ids, labels = torch.randint(0, 50, (4, 6)), torch.randint(0, 3, (4,))
compiled = torch.compile(model, backend="tilefold", options={"strict": strict})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt64 = torch.optim.SGD(oracle.parameters(), lr=0.1)
out = {"losses": [], "grads": [], "oracle_losses": [], "oracle_grads": [], "positive": []}
for _ in range(3):
    for o in (opt, opt64):
        o.zero_grad()
    loss, predicted = compiled(ids, labels)
    want, flat = oracle(ids, labels)
    if view:  # a gradient through the view too
        assert predicted.requires_grad and not predicted._is_view()
        (loss + predicted.square().mean()).backward()
        (want + flat.square().mean()).backward()
        predicted = predicted > 0
    else:
        assert not predicted.requires_grad
        loss.backward()
        want.backward()
    out["losses"].append(loss.item())
    out["oracle_losses"].append(want.item())
    out["grads"].append([p.grad.flatten().tolist() for p in model.parameters()])
    out["oracle_grads"].append([p.grad.flatten().tolist() for p in oracle.parameters()])
    out["positive"].append(predicted.tolist())
    opt.step()
    opt64.step()
out["reports"] = [(r.graph, r.cached, r.mode) for r in report.reports()]
if warm:  # another batch size, then another requires_grad pattern: each must trace
    out["misses"] = []
    for change in (lambda: compiled(ids[:3], labels[:3]),
                   lambda: (model.fc1.weight.requires_grad_(False), compiled(ids, labels))):
        try:
            change()
            out["misses"].append("no trace")
        except Exception as exc:
            out["misses"].append("AOTAutograd traced" in str(exc))
print(json.dumps(out))
'''


def _train(mode: str, cache, graph: str = "plain", strict: bool = True) -> dict:
    """The run's results, and its log (`stderr`)."""
    env = {**os.environ, "TILEFOLD_CACHE_DIR": str(cache), "TILEFOLD_STRICT": str(int(strict)),
           "TILEFOLD_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _TRAIN, mode, graph, str(int(strict))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def _stored(cache) -> dict[str, dict]:
    """The stored graphs by the end of their file name (`forward`, `backward`)."""
    return {p.stem.rsplit("-", 1)[-1]: json.loads(p.read_text())
            for p in (cache / "graphs").glob("*-*.json")}


def test_a_warm_process_trains_without_the_trace_as_the_cold_one(tmp_path):
    cold = _train("cold", tmp_path)
    assert [c for _, c, _ in cold["reports"]] == [False, False]
    # both stored as the pass pipeline made them (no weight is frozen): a hit runs no pass
    assert {part: e["optimized"] for part, e in _stored(tmp_path).items()} == {
        "forward": True, "backward": True}
    warm = _train("warm", tmp_path)
    assert [(g.split()[-1], c, m) for g, c, m in warm["reports"]] == [
        ("forward", True, "tilefold"), ("backward", True, "tilefold")]
    # a hit is the miss's computation: the same losses, gradients and outputs, bit for bit
    for field in ("losses", "grads", "positive"):
        assert warm[field] == cold[field], field
    # and both match float64 eager step by step (the loss within a bound that grows by one
    # gradient's rounding a step, as the parameters drift apart; the first step's gradients,
    # from the same parameters, within the rule)
    reduced = 16 + 32 + 16 + 6 + 3 + 4
    eps = tolerance("f32", reduced)["rtol"]
    for step, (got, want) in enumerate(zip(warm["losses"], warm["oracle_losses"], strict=True)):
        assert abs(got - want) <= eps * (1 + step) * (abs(want) + 1), (step, got, want)
    scale = max(abs(v) for g in warm["oracle_grads"][0] for v in g)
    for got, want in zip(warm["grads"][0], warm["oracle_grads"][0], strict=True):
        assert_close(np.array(got) / scale, np.array(want) / scale, dtype="f32", reduced=reduced)
    assert warm["misses"] == [True, True]  # another batch, another requires_grad: traced


def test_a_graph_with_dropout_is_stored_and_a_hit_draws_as_the_miss(tmp_path):
    cold = _train("cold", tmp_path, "dropout")
    warm = _train("warm", tmp_path, "dropout")
    assert [(g.split()[-1], c) for g, c, _ in warm["reports"]] == [
        ("forward", True), ("backward", True)]
    # the seeds come from PyTorch's generator in both processes: the same masks, bit for bit
    for field in ("losses", "grads", "positive"):
        assert warm[field] == cold[field], field
    assert warm["losses"] != warm["oracle_losses"]  # dropout ran: eager without masks differs


def test_a_corrupt_stored_graph_is_reported_and_traced_afresh(tmp_path):
    """A stored optimized forward that no longer parses: outside strict mode (strict mode
    raises on a stale entry, the fallback this test is about) the process says so, traces as
    a cold one, every graph native, trains bit for bit as it, and stores the graphs again."""
    cold = _train("cold", tmp_path)
    (path,) = (tmp_path / "graphs").glob("*-forward.json")
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "text": entry["text"].replace("fused", "fusd")}))
    again = _train("cold", tmp_path, strict=False)
    assert "the cached lowering failed" in again["stderr"]
    assert [(c, mode) for _, c, mode in again["reports"]] == [(False, "tilefold")] * 2
    for field in ("losses", "grads", "positive"):
        assert again[field] == cold[field], field
    warm = _train("warm", tmp_path)
    assert [c for _, c, _ in warm["reports"]] == [True, True]
    assert warm["losses"] == cold["losses"]


def test_an_output_viewing_an_intermediate_is_stored_and_a_hit_trains_as_the_miss(tmp_path):
    """A view of a saved intermediate returned beside the loss (as GPT-2's graph returns its
    logits): the forward's stored lowering remakes it as a view of that saved result
    (`graph_io.ViewReplay`, stored as its view ops), a hit hands it over as AOTAutograd does
    (`_unsafe_view`), and its gradient flows back."""
    cold = _train("cold", tmp_path, "view")
    (record,) = [r for p in (tmp_path / "graphs").glob("*.json")
                 if "joint" in (r := json.loads(p.read_text()))]
    assert record["joint"]["unsafe_views"] == [1]
    assert _stored(tmp_path)["forward"]["views"]["positions"] == [1]
    warm = _train("warm", tmp_path, "view")
    assert [(g.split()[-1], c) for g, c, _ in warm["reports"]] == [
        ("forward", True), ("backward", True)]
    for field in ("losses", "grads", "positive"):
        assert warm[field] == cold[field], field
    reduced = 16 + 32 + 16 + 6 + 3 + 4
    scale = max(abs(v) for g in warm["oracle_grads"][0] for v in g)
    for got, want in zip(warm["grads"][0], warm["oracle_grads"][0], strict=True):
        assert_close(np.array(got) / scale, np.array(want) / scale, dtype="f32", reduced=reduced)
