"""Gradients of PyTorch's OpInfo samples through the backend, strict: for every lowered op that
PyTorch differentiates, a sample's inputs require grad, `sum((out * g).sum())` with random `g`
is compiled, and `torch.autograd.grad` runs the backward graph AOTAutograd hands to tilefold;
the loss and the gradients must match eager float64 (`opinfo_grad_harness.compare`).

Strict: a graph or node left to PyTorch raises, and counts as a failure like a mismatch. A
sample that fails must be in opinfo_grad_denylist.txt with its reason, and a denylisted sample
that now passes fails the test (the list only shrinks). Of all samples, at least
`NATIVE_FLOOR` run both graphs in tilefold. The default run takes two samples of each op;
TILEFOLD_OPINFO_FULL=1 runs them all.
"""

from __future__ import annotations

import opinfo_grad_harness as g
import opinfo_harness as h
import pytest
import torch

CASES = g.grad_cases()
DENIED = g.read_denylist()
NATIVE_FLOOR = 0.9  # of the samples with something to differentiate, the share run native


@pytest.fixture(autouse=True)
def no_graph_cache(monkeypatch):
    """Every sample is lowered afresh (a stored lowering would skip the rules under test)."""
    monkeypatch.setenv("TILEFOLD_GRAPH_CACHE", "0")
    yield
    torch._dynamo.reset()


def test_cases_cover_the_differentiable_lowered_ops():
    ops = {c.op for c in CASES}
    assert len(ops) >= 60, sorted(ops)
    assert {"softmax", "nn.functional.layer_norm", "mm", "nn.functional.gelu"} <= ops


def test_denylist_names_known_cases():
    known = {(c.op, c.dtype_name) for c in CASES}
    stale = [e for e in DENIED.values() if (e.op, e.dtype) not in known]
    assert not stale, "denylist entries for no gradient case:\n" + "\n".join(
        f"  line {e.line}: {e.op} {e.dtype}" for e in stale)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_opinfo_gradients(case: g.GradCase):
    samples = case.samples()
    inputs = [h.describe(s, case.dtype) for s in samples]
    mine = {e.index: e for e in DENIED.values() if (e.op, e.dtype) == (case.op, case.dtype_name)}
    moved = [e for e in mine.values() if e.index >= len(inputs) or inputs[e.index] != e.inputs]
    assert not moved, "denylisted samples that no longer exist as written:\n" + "\n".join(
        f"  line {e.line}: #{e.index} {e.inputs}" for e in moved)

    tally = g.RESULTS.setdefault(str(case), h.Tally())
    unexpected, now_passing = [], []
    for index in case.picked(len(samples)):
        outcome = g.run_grad_sample(case, samples[index])
        passed = outcome.kind in g.OK_KINDS
        tally.add(outcome, False)
        tally.allowlisted += index in mine and not passed  # a fallback is a failure here too
        if not passed and index not in mine:
            unexpected.append(h.format_entry(case, index, inputs[index],
                                             f"{outcome.kind}: {outcome.detail}"))
        elif passed and index in mine:
            now_passing.append(f"line {mine[index].line} ({outcome.kind}): "
                               + h.format_entry(case, index, inputs[index], mine[index].reason))
    message = []
    if unexpected:
        message += ["gradient failures not in the denylist:", *unexpected]
    if now_passing:
        message += ["denylisted samples that now pass (remove them):", *now_passing]
    assert not message, "\n".join(message)


def test_opinfo_gradients_run_native():
    """The floor over every sample (run here too when the cases above did not run)."""
    tallies = list(g.RESULTS.values())
    if len(tallies) < len(CASES):
        tallies = []
        for case in CASES:
            tally, samples = h.Tally(), case.samples()
            for index in case.picked(len(samples)):
                tally.add(g.run_grad_sample(case, samples[index]), False)
            tallies.append(tally)
    native, total = g.native_share(tallies)
    assert total and native >= NATIVE_FLOOR * total, f"{native} of {total} samples native"


def test_compare_tells_a_wrong_gradient_from_rounding():
    """The check itself: eager float32's gradients pass against float64; one element off by a
    thousandth of the largest gradient, a gradient missing, or one in float64, fail."""
    case = next(c for c in CASES if c.op == "mm")
    sample = case.samples()[0]
    p = g.prepare(case, sample)
    want = g._grads(p.loss, p, torch.float64)
    eager = g._grads(p.loss, p, torch.float32)
    reduced = max(t.numel() for t in p.tensors) + max(w.numel() for w in p.weights)
    assert g.compare(eager, want, eager, reduced) == ""
    scale = max(float(w.abs().max()) for w in want[1:])
    off = [t.clone() for t in eager]
    off[1].view(-1)[0] += scale * 1e-3
    assert "grad 0: 1 of" in g.compare(off, want, eager, reduced)
    assert "no gradient" in g.compare([eager[0], None, eager[2]], want, eager, reduced)
    wide = [eager[0], eager[1].double(), eager[2]]
    assert "expected torch.float32" in g.compare(wide, want, eager, reduced)
