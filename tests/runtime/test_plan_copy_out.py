"""An output that views an intermediate's memory through a reordering view (a transposed
saved activation) is copied into its fresh array where the view is made, not at the end of
the graph: the intermediate's buffer serves later kernels after its last use in the graph."""

from __future__ import annotations

import numpy as np

import tilefold
from tests.tolerances import assert_close
from tilefold.ir import parse_module

# %0, %1 and %2 are each returned transposed (the graph lists those views last, as a forward
# graph lists its saved activations) and each read by the next matmul
TEXT = """\
func @main(%x: f32[64,64], %w: f32[64,64]) -> (f32[64,64], f32[64,64], f32[64,64], f32[64,64]) {
  %0 = matmul(%x, %w) : f32[64,64]
  %1 = matmul(%0, %w) : f32[64,64]
  %2 = matmul(%1, %w) : f32[64,64]
  %3 = matmul(%2, %w) : f32[64,64]
  %4 = transpose(%0) {perm = [1, 0]} : f32[64,64]
  %5 = transpose(%1) {perm = [1, 0]} : f32[64,64]
  %6 = transpose(%2) {perm = [1, 0]} : f32[64,64]
  return(%3, %4, %5, %6)
}
"""


def test_a_transposed_output_frees_its_buffer_at_its_last_use() -> None:
    graph = tilefold.compile(parse_module(TEXT, "copy_out.tfir"), strict=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)  # keeps the chain's scale
    chain = [x.astype(np.float64)]
    for _ in range(4):
        chain.append(chain[-1] @ w.astype(np.float64))
    want = [chain[4], chain[1].T, chain[2].T, chain[3].T]
    for _ in range(3):  # the second call records, the third replays
        got = graph(x, w)
        for g, e in zip(got, want, strict=True):
            assert_close(g, e, dtype="f32", reduced=64 * 4)
        assert all(g.flags.c_contiguous for g in got)  # a backward reads them without a copy
        assert len({g.ctypes.data for g in got}) == 4  # results never share memory
    plan = graph.plan_for(x.shape, w.shape)
    # two 16 KiB buffers at once (a matmul's operand and its result); kept to the end, the
    # three returned ones had taken three
    assert plan.nbytes == 2 * 64 * 64 * 4, plan.nbytes
