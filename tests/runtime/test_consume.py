"""`CompiledGraph.consume`: the call that takes its input arrays over (a training backward's
saved activations) lets each go after the last step reading it and allocates each result just
before the step writing it, so the memory an input held can serve a result."""

from __future__ import annotations

import weakref

import numpy as np

import tilefold
from tests.tolerances import assert_close
from tilefold import compiler
from tilefold.ir import parse_module

# %x is read by the first matmul alone; the result is written by the second
TEXT = """\
func @main(%x: f32[96,64], %w: f32[64,64]) -> (f32[96,64]) {
  %0 = matmul(%x, %w) : f32[96,64]
  %1 = matmul(%0, %w) : f32[96,64]
  return(%1)
}
"""


def test_an_input_is_gone_before_the_result_is_allocated(monkeypatch) -> None:
    graph = tilefold.compile(parse_module(TEXT, "consume.tfir"), strict=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    want = x.astype(np.float64) @ w @ w
    assert_close(graph(x.copy(), w)[0], want, dtype="f32", reduced=128)  # planned
    alive: list[bool] = []
    allocate = compiler.poison  # strict: results start poisoned

    def spy(shape, dtype):
        alive.append(taken() is not None)
        return allocate(shape, dtype)

    monkeypatch.setattr(compiler, "poison", spy)
    args = [x.copy(), w]
    taken = weakref.ref(args[0])
    (got,) = graph.consume(args)
    assert args == []  # taken over
    assert alive == [False], alive  # the result allocated once the input was let go
    assert taken() is None
    assert_close(got, want, dtype="f32", reduced=128)
    # a caller that still holds an input keeps it: only the graph's references go
    kept = x.copy()
    (again,) = graph.consume([kept, w])
    assert_close(again, want, dtype="f32", reduced=128)
    np.testing.assert_array_equal(kept, x)
