"""PyTorch's OpInfo samples of every lowered ATen op match eager PyTorch through the backend.

A sample either runs in tilefold or falls back to PyTorch; one that mismatches or raises must be
in opinfo_allowlist.txt with a reason, and an allowlisted sample that now passes fails the test
(so the list only shrinks), unless its reason starts with "flaky". The default run takes a few
samples of each op and dtype; TILEFOLD_OPINFO_FULL=1 runs them all.

Under `torch.compile(dynamic=True)` (every dim Dynamo may make symbolic is) one sample of each
op runs too, the one with the most such dims (all with TILEFOLD_OPINFO_FULL=1): it must match
eager like the static one, and may fall back to PyTorch only where the static compile does;
of all of them at least `DYNAMIC_FLOOR` run in tilefold.
"""

from __future__ import annotations

import opinfo_harness as h
import pytest
import torch

CASES = h.cases()
DYNAMIC_CASES = h.dynamic_cases()
ALLOWED = h.read_allowlist()
DYNAMIC_FLOOR = 0.9  # of the dynamic samples, the share run in tilefold (the rest: no rule)


@pytest.fixture(autouse=True)
def no_graph_cache(monkeypatch):
    """Every sample is lowered afresh (a stored lowering would skip the rules under test)."""
    monkeypatch.setenv("TILEFOLD_GRAPH_CACHE", "0")
    yield
    torch._dynamo.reset()


def test_every_rule_table_contributes_cases():
    ops = {h.aten_packet(c.info) for c in CASES}
    assert len(ops) >= 50, sorted(map(str, ops))
    assert torch.ops.aten.softmax in ops and torch.ops.aten.add in ops


def test_allowlist_names_known_cases():
    known = {(c.op, c.dtype_name) for c in CASES}
    stale = [e for e in ALLOWED.values() if (e.op, e.dtype) not in known]
    assert not stale, "allowlist entries for no OpInfo case:\n" + "\n".join(
        f"  line {e.line}: {e.op} {e.dtype}" for e in stale)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_opinfo_samples(case: h.Case):
    samples = case.samples()
    inputs = [h.describe(s, case.dtype) for s in samples]
    mine = {e.index: e for e in ALLOWED.values() if (e.op, e.dtype) == (case.op, case.dtype_name)}
    moved = [e for e in mine.values() if e.index >= len(inputs) or inputs[e.index] != e.inputs]
    assert not moved, "allowlisted samples that no longer exist as written:\n" + "\n".join(
        f"  line {e.line}: #{e.index} {e.inputs}" for e in moved)

    tally = h.RESULTS.setdefault(str(case), h.Tally())
    unexpected, now_passing = [], []
    for index in case.picked(len(samples)):
        outcome = h.run_sample(case, samples[index])
        tally.add(outcome, index in mine)
        if outcome.failed and index not in mine:
            unexpected.append(h.format_entry(case, index, inputs[index],
                                             f"{outcome.kind}: {outcome.detail}"))
        elif not outcome.failed and index in mine and not mine[index].reason.startswith("flaky"):
            now_passing.append(f"line {mine[index].line} ({outcome.kind}): "
                               + h.format_entry(case, index, inputs[index], mine[index].reason))
    message = []
    if unexpected:
        message += ["failures not in the allowlist:", *unexpected]
    if now_passing:
        message += ["allowlisted samples that now pass (remove them):", *now_passing]
    assert not message, "\n".join(message)


@pytest.mark.parametrize("case", DYNAMIC_CASES, ids=str)
def test_opinfo_samples_dynamic(case: h.Case):
    samples = case.samples()
    mine = {e.index for e in ALLOWED.values() if (e.op, e.dtype) == (case.op, case.dtype_name)}
    tally = h.RESULTS.setdefault(f"{case} dynamic", h.Tally())
    problems = []
    for index in h.dynamic_picked(case, samples):
        outcome = h.run_sample(case, samples[index], dynamic=True)
        tally.add(outcome, index in mine)
        inputs = h.describe(samples[index], case.dtype)
        if outcome.failed and index not in mine:
            problems.append(h.format_entry(case, index, inputs,
                                           f"dynamic {outcome.kind}: {outcome.detail}"))
        elif outcome.kind == "fallback":
            static = h.run_sample(case, samples[index])
            if static.kind == "tilefold":
                problems.append(h.format_entry(case, index, inputs, "runs in tilefold static, "
                                               f"falls back under dynamic=True: {outcome.detail}"))
    assert not problems, "\n".join(problems)


def test_opinfo_dynamic_samples_run_in_tilefold():
    """The floor over the dynamic run (which this runs itself when the cases did not)."""
    tallies = [t for k, t in h.RESULTS.items() if k.endswith(" dynamic")]
    if len(tallies) < len(DYNAMIC_CASES):
        tallies = []
        for case in DYNAMIC_CASES:
            tally, samples = h.Tally(), case.samples()
            for index in h.dynamic_picked(case, samples):
                tally.add(h.run_sample(case, samples[index], dynamic=True), False)
            tallies.append(tally)
    ran = sum(t.counts.get("tilefold", 0) + t.counts.get("random", 0) for t in tallies)
    total = sum(t.total for t in tallies)
    assert ran >= DYNAMIC_FLOOR * total, f"{ran} of {total} dynamic samples ran in tilefold"
