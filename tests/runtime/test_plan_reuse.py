"""A plan's dead intermediate gives its buffer to a later one of another shape (raw bytes, up to
`compiler.FIT` times larger than the need), not only to one of the same shape and dtype."""

from __future__ import annotations

import numpy as np

import tilefold
from tests.tolerances import assert_close
from tilefold.ir import parse_module

# %0 (16 KiB) is dead once %1 is made; %2 (8 KiB, another shape) takes its buffer
TEXT = """\
func @main(%x: f32[64,64], %w: f32[64,32], %v: f32[32,64]) -> (f32[64,64]) {
  %0 = exp(%x) : f32[64,64]
  %1 = matmul(%0, %0) : f32[64,64]
  %2 = matmul(%1, %w) : f32[64,32]
  %3 = matmul(%2, %v) : f32[64,64]
  return(%3)
}
"""


def test_a_dead_buffer_serves_a_smaller_intermediate_of_another_shape() -> None:
    graph = tilefold.compile(parse_module(TEXT, "reuse.tfir"), strict=True)
    rng = np.random.default_rng(0)
    x, w, v = (rng.standard_normal(s).astype(np.float32) * 0.1
               for s in ((64, 64), (64, 32), (32, 64)))
    e = np.exp(x.astype(np.float64))
    want = ((e @ e) @ w) @ v
    for _ in range(3):  # the second call records, the third replays
        assert_close(graph(x, w, v)[0], want, dtype="f32", reduced=64 * 3)
    plan = graph.plan_for(x.shape, w.shape, v.shape)
    assert plan.nbytes == 2 * 64 * 64 * 4, plan.nbytes  # %0's (then %2's) and %1's
