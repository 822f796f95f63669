"""A lone `index_put` whose operand 0 cannot be overwritten (a zero-filled broadcast, as an
embedding's gradient starts) runs as `handwritten.movement`: the operand copied into the
output, then a native scatter, adding with `accumulate`; strict, against `np.add.at` and
NumPy's assignment computed here, on token ids of rank 1 and 2 with repeats and negatives, and
replayed on the same arrays as well as called anew."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.compiler import compile
from tilefold.errors import ShapeError
from tilefold.ir import parse_module


def _graph(index_shape: str, accumulate: bool) -> str:
    return f"""func @main(%v: f32[{index_shape},6], %i: i64[{index_shape}]) -> (f32[50,6]) {{
      %z = constant() {{value = dense<f32[] [0.0]>}} : f32[]
      %x = broadcast_to(%z) {{shape = [50, 6]}} : f32[50,6]
      %r = index_put(%x, %v, %i) {{axes = [0], accumulate = {str(accumulate).lower()}}} : f32[50,6]
      return(%r)
    }}"""


@pytest.mark.parametrize("index_shape", [(40,), (4, 9)])
@pytest.mark.parametrize("accumulate", [True, False])
def test_index_put_of_a_zero_table_is_a_native_scatter(index_shape, accumulate):
    graph = compile(parse_module(_graph(",".join(map(str, index_shape)), accumulate)),
                    strict=True)
    rng = np.random.default_rng(5)
    values = rng.standard_normal((*index_shape, 6)).astype(np.float32)
    index = rng.integers(-50, 50, index_shape)
    if not accumulate:  # assignment with repeats: the order is unspecified; keep them distinct
        rows = rng.permutation(50)[:np.prod(index_shape)]
        index = np.where(rng.random(rows.size) < 0.5, rows - 50, rows).reshape(index_shape)
    else:
        index.reshape(-1)[:6] = 7  # one token six times
    want = np.zeros((50, 6), np.float32)
    if accumulate:
        np.add.at(want, index, values)
    else:
        want[index] = values
    decision = graph.decisions(values.shape, index.shape)[0]
    assert decision.winner.method == "handwritten.movement"
    for _ in range(3):  # a call, a recording, a replay
        (got,) = graph(values, index)
        assert got.tobytes() == want.tobytes()


def test_index_put_out_of_range_is_a_shape_error():
    graph = compile(parse_module(_graph("3", True)), strict=True)
    with pytest.raises(ShapeError, match="out of range"):
        graph(np.ones((3, 6), np.float32), np.array([0, 50, 1]))
