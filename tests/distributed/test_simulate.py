"""The simulated mesh as an oracle: a sharded (SPMD) program assembled from its ranks equals the
global program and float64 NumPy; programs it cannot run say why."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.distributed import (
    RULES,
    Einsum,
    ReplicaMismatchError,
    SimulationError,
    assemble,
    run_ranks,
    simulate,
)
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


def test_a_missing_all_reduce_is_refused() -> None:
    """Adding the bias to partial sums would add it four times: no rule allows it."""
    text = ROW_PARALLEL.replace(
        '%s = all_reduce(%p) {axis = "tp"} : f64[6,12] @m[S(0),R]\n', "").replace(
        "add(%s", "add(%p")
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((6, 8)), rng.standard_normal((8, 12)), rng.standard_normal(12)
    with pytest.raises(SimulationError, match=r"'add' has operands placed \['\[S\(0\),P\(sum\)"
                       r"\]', '\[R,R\]'\] but 'add' by ab,b->ab gives \[S\(0\),R \(axis 1: "):
        simulate(verify(parse_module(text)), x, w, b)


def test_placements_the_rules_do_not_give_are_refused() -> None:
    text = """mesh @m [tp=2]
func @main(%x: f32[4] @m[P(sum)]) -> (f32[4] @m[P(sum)]) {
  %y = relu(%x) : f32[4] @m[P(sum)]
  return(%y)
}"""
    with pytest.raises(SimulationError, match=r"'relu' has operands placed \['\[P\(sum\)\]'\]"):
        simulate(verify(parse_module(text)), np.ones(4, np.float32))
    text = text.replace("%x: f32[4] @m[P(sum)]", "%x: f32[4] @m[S(0)]")
    with pytest.raises(SimulationError, match=r"'relu' result %y is declared f32\[4\] "
                       r"@m\[P\(sum\)\], but its operands give \[S\(0\)\]"):
        simulate(verify(parse_module(text)), np.ones(4, np.float32))


def test_replicas_that_differ_are_caught() -> None:
    module = verify(parse_module("mesh @m [tp=2]\nfunc @main(%x: f32[3] @m[R]) -> "
                                 "(f32[3] @m[R]) { return(%x) }"))
    t = module["main"].args[0].type
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(assemble([a, a.copy()], t), a)
    with pytest.raises(ReplicaMismatchError, match="block 1 is not block 0"):
        assemble([a, a + 1], t)


def test_a_sharded_reshape_runs_on_local_sizes() -> None:
    """The rule ties S(0) of [4,6] to S(0) of [24]; each rank reshapes its block to [12]."""
    text = """mesh @m [tp=2]
func @main(%x: f32[4,6] @m[S(0)]) -> (f32[24] @m[S(0)]) {
  %y = reshape(%x) {shape = [24]} : f32[24] @m[S(0)]
  return(%y)
}"""
    x = np.random.default_rng(6).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(simulate(verify(parse_module(text)), x)[0], x.reshape(24))


def test_a_sharded_op_without_a_rule_is_refused() -> None:
    text = """mesh @m [tp=2]
func @main(%x: f32[4,6] @m[S(0)]) -> (f32[2,4,6] @m[S(1)]) {
  %y = broadcast_to(%x) {shape = [2,4,6]} : f32[2,4,6] @m[S(1)]
  return(%y)
}"""
    with pytest.raises(SimulationError, match=r"'broadcast_to' has no sharding rule: it runs "
                       r"replicated: redistribute them first"):
        simulate(verify(parse_module(text)), np.ones((4, 6), np.float32))


def test_an_op_whose_attributes_name_global_sizes_is_refused(monkeypatch) -> None:
    """A broadcast_to given a rule but no per-rank shape would broadcast each block to the
    global shape."""
    monkeypatch.setitem(RULES, "broadcast_to", lambda op: Einsum(("bc",), "abc"))
    text = """mesh @m [tp=2]
func @main(%x: f32[4,6] @m[S(0)]) -> (f32[2,4,6] @m[S(1)]) {
  %y = broadcast_to(%x) {shape = [2,4,6]} : f32[2,4,6] @m[S(1)]
  return(%y)
}"""
    with pytest.raises(SimulationError, match=r"'broadcast_to' attribute\(s\) shape name "
                       r"global sizes.*add the op to LOCAL_ATTRS"):
        simulate(verify(parse_module(text)), np.ones((4, 6), np.float32))


def test_a_slice_keeping_a_split_dim_whole_runs_on_local_bounds() -> None:
    text = """mesh @m [tp=2]
func @main(%x: f32[4,6] @m[S(0)]) -> (f32[4,3] @m[S(0)]) {
  %y = slice(%x) {starts = [0, 1], stops = [4, 4], steps = [1, 1]} : f32[4,3] @m[S(0)]
  return(%y)
}"""
    x = np.random.default_rng(8).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(simulate(verify(parse_module(text)), x)[0], x[:, 1:4])


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
