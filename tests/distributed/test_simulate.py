"""The simulated mesh as an oracle: a sharded (SPMD) program assembled from its ranks equals the
global program and float64 NumPy; programs it cannot run say why."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.distributed import ReplicaMismatchError, SimulationError, run_ranks, simulate
from tilefold.errors import ShapeError
from tilefold.ir import interpret, parse_module, verify

ROW_PARALLEL = """
mesh @m [dp=2, tp=4]
func @main(%x: f64[6,8] @m[S(0),S(1)], %w: f64[8,12] @m[R,S(0)], %b: f64[12] @m[R,R])
    -> (f64[6,12] @m[S(0),R]) {
  %p = matmul(%x, %w) : f64[6,12] @m[S(0),P(sum)]
  %s = all_reduce(%p) {axis = "tp"} : f64[6,12] @m[S(0),R]
  %y = add(%s, %b) : f64[6,12] @m[S(0),R]
  %g = gelu(%y) : f64[6,12] @m[S(0),R]
  return(%g)
}
"""

GLOBAL = """
func @main(%x: f64[6,8], %w: f64[8,12], %b: f64[12]) -> (f64[6,12]) {
  %p = matmul(%x, %w) : f64[6,12]
  %y = add(%p, %b) : f64[6,12]
  %g = gelu(%y) : f64[6,12]
  return(%g)
}
"""


def gelu(x: np.ndarray) -> np.ndarray:
    from math import erf, sqrt

    return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))


def test_row_parallel_matmul_matches_numpy_and_the_global_program() -> None:
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((6, 8)), rng.standard_normal((8, 12)), rng.standard_normal(12)
    (got,) = simulate(verify(parse_module(ROW_PARALLEL)), x, w, b)
    want = gelu(x @ w + b)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    (global_,) = interpret(verify(parse_module(GLOBAL)), x, w, b)
    np.testing.assert_allclose(got, global_, rtol=1e-13, atol=1e-13)


def test_a_missing_all_reduce_is_caught_as_a_wrong_answer() -> None:
    """Without the all_reduce the partial sums are added to the bias four times."""
    text = ROW_PARALLEL.replace(
        '%s = all_reduce(%p) {axis = "tp"} : f64[6,12] @m[S(0),R]',
        "%s = relu(%p) : f64[6,12] @m[S(0),R]").replace("add(%s", "add(%p")
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((6, 8)), rng.standard_normal((8, 12)), rng.standard_normal(12)
    with pytest.raises(ReplicaMismatchError, match="replicated value differs"):
        simulate(verify(parse_module(text)), x, w, b)


def test_an_op_with_global_sizes_in_its_attributes_is_refused() -> None:
    text = """mesh @m [tp=2]
func @main(%x: f32[4,6] @m[S(0)]) -> (f32[24] @m[S(0)]) {
  %y = reshape(%x) {shape = [24]} : f32[24] @m[S(0)]
  return(%y)
}"""
    with pytest.raises(SimulationError, match=r"'reshape' cannot run on rank 0's blocks "
                       r"\(\[2, 6\]\).*must first be partitioned per rank"):
        simulate(verify(parse_module(text)), np.ones((4, 6), np.float32))


def test_blocks_of_the_wrong_local_shape_are_refused() -> None:
    module = verify(parse_module("mesh @m [tp=2]\nfunc @main(%x: f32[4] @m[S(0)]) -> "
                                 "(f32[4] @m[S(0)]) { return(%x) }"))
    with pytest.raises(ShapeError, match=r"rank 1's block of %x: f32\[4\] @m\[S\(0\)\] is "
                       r"float32\[4\], expected float32\[2\]"):
        run_ranks(module, [[np.ones(2, np.float32), np.ones(4, np.float32)]])


def test_a_function_without_a_mesh_cannot_be_simulated() -> None:
    module = verify(parse_module("func @main(%x: f32[4]) -> (f32[4]) { return(%x) }"))
    with pytest.raises(SimulationError, match="exactly one mesh"):
        simulate(module, np.ones(4, np.float32))
