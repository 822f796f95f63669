"""A plan's reshape copies (a reshape of a transposed view): each takes a buffer of the plan's
free ones and gives it back once the memory it was copied from is dead, as kernel results do."""

from __future__ import annotations

import numpy as np

import tilefold
from tests.tolerances import assert_close
from tilefold.ir import parse_module

# attention's heads-to-hidden shuffle twice: %2 and %8 are copies of the same shape, %2's
# dead once %3 is made
TEXT = """\
func @main(%x: f32[64,32,16]) -> (f32[32,1024]) {
  %0 = exp(%x) : f32[64,32,16]
  %1 = transpose(%0) {perm = [1, 0, 2]} : f32[32,64,16]
  %2 = reshape(%1) {shape = [32, 1024]} : f32[32,1024]
  %3 = tanh(%2) : f32[32,1024]
  %4 = reshape(%3) {shape = [32, 64, 16]} : f32[32,64,16]
  %5 = transpose(%4) {perm = [1, 0, 2]} : f32[64,32,16]
  %6 = exp(%5) : f32[64,32,16]
  %7 = transpose(%6) {perm = [1, 0, 2]} : f32[32,64,16]
  %8 = reshape(%7) {shape = [32, 1024]} : f32[32,1024]
  %9 = tanh(%8) : f32[32,1024]
  return(%9)
}
"""


def test_a_dead_reshape_copy_gives_its_buffer_back() -> None:
    graph = tilefold.compile(parse_module(TEXT, "copies.tfir"), strict=True)
    x = np.random.default_rng(0).standard_normal((64, 32, 16)).astype(np.float32)
    want = np.exp(x).transpose(1, 0, 2).reshape(32, 1024)
    want = np.exp(np.tanh(want).reshape(32, 64, 16).transpose(1, 0, 2))
    want = np.tanh(want.transpose(1, 0, 2).reshape(32, 1024))
    for _ in range(3):  # the second call records, the third replays
        assert_close(graph(x)[0], want, dtype="f32", reduced=1)
    plan = graph.plan_for(x.shape)
    assert [plan.layout[v] for v in ("2", "8")] == ["copy", "copy"]
    # %0 or %6, %2 or %8, and %3: three buffers of 128 KiB at once, never a fourth
    assert plan.nbytes == 3 * 32 * 1024 * 4, plan.nbytes
