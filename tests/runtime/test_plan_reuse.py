"""A plan's dead intermediate gives its memory to a later one of another shape (raw bytes placed by
size and lifetime: `compiler.place`), not only to one of the same shape and dtype."""

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


def test_placement_never_overlaps_living_buffers_and_packs_to_the_live_peak() -> None:
    """`compiler.place` on random lifetimes: two buffers living at once never share a byte,
    offsets are aligned, and the block is at least the most bytes alive at once (and here,
    where sizes repeat, no more than twice that)."""
    from tilefold.compiler import ALIGN, place

    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        requests = []
        for _ in range(n):
            first = int(rng.integers(0, 100))
            requests.append((int(rng.choice([1, 100, 4096, 65536, 1 << 20])), first,
                             first + int(rng.integers(1, 30))))
        offsets, total = place(requests)
        sizes = [-(-s // ALIGN) * ALIGN for s, _, _ in requests]
        assert all(o % ALIGN == 0 and o + s <= total for o, s in zip(offsets, sizes, strict=True))
        for i in range(n):
            for j in range(i):
                (_, f1, l1), (_, f2, l2) = requests[i], requests[j]
                if f1 < l2 and f2 < l1:
                    assert offsets[i] + sizes[i] <= offsets[j] or \
                        offsets[j] + sizes[j] <= offsets[i]
        live = max(sum(s for s, (_, f, last) in zip(sizes, requests, strict=True)
                       if f <= t < last)
                   for t in range(130))
        assert live <= total <= 2 * live
