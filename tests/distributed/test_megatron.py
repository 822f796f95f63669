"""Megatron tensor parallelism from placements alone: weights placed column- then row-parallel,
propagate-sharding + expand-redistribute give the SPMD program with one all_reduce, and the
simulated mesh matches float64 NumPy."""

from __future__ import annotations

from math import erf, sqrt

import numpy as np
import pytest

from tilefold.distributed import explain, simulate
from tilefold.ir import parse_module, print_module, verify
from tilefold.passes import run_pipeline

MLP = """
mesh @m [dp=2, tp=4]
func @main(%x: f64[6,8] @m[S(0),R], %w1: f64[8,16] @m[R,S(1)], %b1: f64[16] @m[R,S(0)],
           %w2: f64[16,8] @m[R,S(0)], %b2: f64[8] @m[R,R]) -> (f64[6,8]) {
  %h = matmul(%x, %w1) : f64[6,16]
  %a = add(%h, %b1) : f64[6,16]
  %g = gelu(%a) : f64[6,16]
  %o = matmul(%g, %w2) : f64[6,8]
  %y = add(%o, %b2) : f64[6,8]
  return(%y)
}
"""


def numpy_mlp(x, w1, b1, w2, b2):
    a = x @ w1 + b1
    g = 0.5 * a * (1 + np.vectorize(erf)(a / sqrt(2)))
    return g @ w2 + b2


def partitioned(text: str):
    module = parse_module(text)
    run_pipeline(module, "propagate-sharding,expand-redistribute")
    return verify(module)


def test_column_then_row_parallel_needs_one_all_reduce() -> None:
    module = partitioned(MLP)
    ops = [op.name for op in module["main"].ops]
    assert ops == ["matmul", "add", "gelu", "matmul", "all_reduce", "add", "return"]
    types = {op.results[0].name: str(op.results[0].type) for op in module["main"].ops[:-1]}
    assert types["h"] == "f64[6,16] @m[S(0),S(1)]"
    assert types["o"] == "f64[6,8] @m[S(0),P(sum)]"
    assert types["y"] == "f64[6,8] @m[S(0),R]"
    assert print_module(verify(parse_module(print_module(module)))) == print_module(module)


def test_the_spmd_program_matches_numpy_on_the_simulated_mesh() -> None:
    rng = np.random.default_rng(11)
    args = [rng.standard_normal(s) for s in ((6, 8), (8, 16), (16,), (16, 8), (8,))]
    (got,) = simulate(partitioned(MLP), *args)
    np.testing.assert_allclose(got, numpy_mlp(*args), rtol=1e-12, atol=1e-12)


def test_explain_names_the_rule_or_says_replicated() -> None:
    lines = explain(parse_module(MLP))
    assert lines[0] == "%h: 'matmul' by mk,kn->mn gives [S(0),S(1)]"
    assert lines[3] == "%o: 'matmul' by mk,kn->mn gives [S(0),P(sum)]"
    assert lines[4] == ("%y: 'add' by ab,b->ab gives [S(0),R (axis 1: ab,b->ab does not pass "
                        "these partial sums through: replicated)]")
    text = MLP.replace("%y = add(%o, %b2) : f64[6,8]", "%y = cumsum(%o) {axis = 0} : f64[6,8]")
    text = text.replace("%b2: f64[8] @m[R,R]", "%b2: f64[8]")
    assert explain(parse_module(text))[4] == "%y: 'cumsum' has no sharding rule: it runs replicated"


@pytest.mark.parametrize(
    "x, w, expected",
    [
        ("f64[6,8] @m[S(0),S(1)]", "f64[8,4] @m[R,S(0)]", "[S(0),P(sum)]"),
        ("f64[6,8] @m[R,R]", "f64[8,4] @m[R,S(1)]", "[R,S(1)]"),
        ("f64[6,8] @m[S(1),R]", "f64[8,4] @m[S(0),R]", "[P(sum),R]"),
    ],
)
def test_matmul_placements_follow_the_einsum(x, w, expected) -> None:
    text = (f"mesh @m [dp=2, tp=2]\nfunc @main(%x: {x}, %w: {w}) -> (f64[6,4]) {{\n"
            "  %y = matmul(%x, %w) : f64[6,4]\n  return(%y)\n}")
    module = parse_module(text)
    run_pipeline(module, "propagate-sharding")
    assert str(module["main"].result_types[0]).endswith(expected)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 8)), rng.standard_normal((8, 4))
    np.testing.assert_allclose(simulate(verify(module), a, b)[0], a @ b, rtol=1e-12, atol=1e-12)


def test_reductions_and_softmax() -> None:
    text = """mesh @m [tp=2]
func @main(%x: f64[4,6] @m[S(1)]) -> (f64[4], f64[4], f64[4,6]) {
  %s = reduce_sum(%x) {axes = [1]} : f64[4]
  %m = reduce_max(%x) {axes = [1]} : f64[4]
  %p = softmax(%x) {axis = 1} : f64[4,6]
  return(%s, %m, %p)
}"""
    module = parse_module(text)
    run_pipeline(module, "propagate-sharding")
    results = [str(t) for t in module["main"].result_types]
    assert results == ["f64[4] @m[P(sum)]", "f64[4] @m[P(max)]", "f64[4,6] @m[R]"]
    x = np.random.default_rng(2).standard_normal((4, 6))
    s, m, p = simulate(verify(module), x)
    np.testing.assert_allclose(s, x.sum(1), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(m, x.max(1))
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(1, keepdims=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("x_place, expected", [("S(0)", "S(0)"), ("S(1)", "R")])
def test_layer_norm_splits_rows_but_not_the_normalized_dim(x_place, expected) -> None:
    affine = "S(0)" if x_place == "S(1)" else "R"  # what a split normalized dim would need
    text = f"""mesh @m [tp=2]
func @main(%x: f64[4,6] @m[{x_place}], %w: f64[6] @m[{affine}],
           %b: f64[6] @m[{affine}]) -> (f64[4,6]) {{
  %y = layer_norm(%x, %w, %b) : f64[4,6]
  return(%y)
}}"""
    module = parse_module(text)
    run_pipeline(module, "propagate-sharding,expand-redistribute")
    assert str(module["main"].result_types[0]) == f"f64[4,6] @m[{expected}]"
    rng = np.random.default_rng(8)
    x, w, b = rng.standard_normal((4, 6)), rng.standard_normal(6), rng.standard_normal(6)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(simulate(verify(module), x, w, b)[0], want, rtol=1e-12,
                               atol=1e-12)
