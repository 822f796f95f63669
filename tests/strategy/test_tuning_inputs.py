"""Tuning times candidates on inputs every group can take (gather indices stay in range)."""

from __future__ import annotations

import numpy as np
import pytest

import tilefold as tf
from tilefold.ir import Builder
from tilefold.ir import functional as F


def test_tuning_a_gather_from_a_small_table_compiles(monkeypatch):
    monkeypatch.setenv("TILEFOLD_TUNE", "0.2")
    rng = np.random.default_rng(3)
    b = Builder("main")
    ids = b.arg("ids", "i64", ("n",))
    table = b.constant(rng.standard_normal((2, 8)).astype(np.float32))
    module = b.build(F.gelu(F.embedding(table, ids) * 2.0))
    run = tf.compile(module)
    x = rng.integers(0, 2, 37)
    (got,) = run(x)
    (want,) = tf.interpret(module, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_measuring_charges_the_kernel_for_what_it_leaves_behind():
    """The neighbour (the graph's next kernel) runs inside the timed span, after the call:
    a kernel whose threads keep spinning is charged for slowing it down."""
    import time

    from tilefold.strategy import autotune

    calls = []
    charged = autotune.measure({"run": lambda: calls.append("run")}, 0.0,
                               neighbour=lambda: time.sleep(0.002))["run"]
    assert charged >= 0.002  # every timed span holds the neighbour's 2 ms sleep
    assert len(calls) >= 4  # a warm-up and at least three timed calls


def test_candidates_are_timed_interleaved():
    """Each round calls every candidate once, starting one further along each time, so a slow
    spell of a shared host lands on all of them alike."""
    import time

    from tilefold.strategy import autotune

    order = []
    medians = autotune.measure({"slow": lambda: (order.append("slow"), time.sleep(0.003)),
                                "fast": lambda: order.append("fast")}, 0.0)
    assert medians["slow"] >= 0.003
    assert order[:2] == ["slow", "fast"]  # the warm-up calls
    rounds = [order[i:i + 2] for i in range(2, len(order), 2)]
    assert len(rounds) >= 3 and all(sorted(r) == ["fast", "slow"] for r in rounds)
    assert rounds[0] != rounds[1]  # the starting candidate rotates


@pytest.mark.timing
def test_a_candidate_that_does_nothing_measures_under_a_millisecond():
    from tilefold.strategy import autotune

    medians = autotune.measure({"nothing": lambda: None, "also": lambda: None}, 0.0)
    assert max(medians.values()) < 0.001, medians
