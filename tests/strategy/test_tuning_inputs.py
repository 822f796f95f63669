"""Tuning times candidates on inputs every group can take (gather indices stay in range)."""

from __future__ import annotations

import numpy as np

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
    fast = autotune.measure(lambda: calls.append("run"), [], 0.0)
    charged = autotune.measure(lambda: calls.append("run"), [], 0.0,
                               neighbour=lambda: time.sleep(0.002))
    assert fast < 0.001 <= 0.002 <= charged
    assert len(calls) >= 8  # a warm-up and at least three timed calls each
