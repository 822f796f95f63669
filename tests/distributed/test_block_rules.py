"""Sharding rules for the ops of transformer blocks (views, embedding lookup, attention,
batched matmul): the placements they derive, and the simulated mesh against float64 NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.distributed import explain, simulate
from tilefold.ir import parse_module, verify
from tilefold.passes import run_pipeline

TOL = {"rtol": 1e-12, "atol": 1e-12}


def placed(text: str):
    module = parse_module(text)
    run_pipeline(module, "propagate-sharding,expand-redistribute")
    return verify(module)


def result_placements(module) -> list[str]:
    return [str(t).split(" @m", 1)[1] for t in module["main"].result_types]


@pytest.mark.parametrize("place, expected", [
    ("[S(1)]", "[S(1)]"), ("[S(0)]", "[S(0)]"), ("[R]", "[R]"), ("[P(sum)]", "[P(sum)]")])
def test_reshape_splits_heads_and_merges_them_back(place, expected) -> None:
    text = f"""mesh @m [tp=2]
func @main(%x: f64[6,8] @m{place}) -> (f64[6,8], f64[6,2,4]) {{
  %h = reshape(%x) {{shape = [6,2,4]}} : f64[6,2,4]
  %t = transpose(%h) {{perm = [1,0,2]}} : f64[2,6,4]
  %b = transpose(%t) {{perm = [1,0,2]}} : f64[6,2,4]
  %y = reshape(%b) {{shape = [6,8]}} : f64[6,8]
  return(%y, %h)
}}"""
    module = placed(text)
    assert result_placements(module)[0] == expected
    assert [op.name for op in module["main"].ops].count("all_gather") == 0
    x = np.random.default_rng(1).standard_normal((6, 8))
    y, h = simulate(module, x, rng=np.random.default_rng(2))
    np.testing.assert_allclose(y, x, **TOL)
    np.testing.assert_allclose(h, x.reshape(6, 2, 4), **TOL)


def test_reshape_replicates_a_dim_it_cannot_follow() -> None:
    # S(1) on 8 = 2*4 with tp=4 would leave 2 heads for 4 devices: uneven, so replicated
    text = """mesh @m [tp=4]
func @main(%x: f64[4,8] @m[S(1)]) -> (f64[4,2,4], f64[32]) {
  %h = reshape(%x) {shape = [4,2,4]} : f64[4,2,4]
  %f = reshape(%x) {shape = [32]} : f64[32]
  return(%h, %f)
}"""
    module = placed(text)
    assert result_placements(module) == ["[R]", "[R]"]
    assert "uneven" in explain(parse_module(text))[0]
    x = np.random.default_rng(3).standard_normal((4, 8))
    h, f = simulate(module, x)
    np.testing.assert_allclose(h, x.reshape(4, 2, 4), **TOL)
    np.testing.assert_allclose(f, x.reshape(32), **TOL)


def test_unit_dims_and_whole_slices_keep_their_shards() -> None:
    text = """mesh @m [a=2, b=2]
func @main(%x: f64[4,6] @m[S(0),S(1)]) -> (f64[4,1,6], f64[4,6], f64[4,3]) {
  %e = expand_dims(%x) {axes = [1]} : f64[4,1,6]
  %s = squeeze(%e) {axes = [1]} : f64[4,6]
  %c = slice(%s) {starts = [0,0], stops = [4,6], steps = [1,2]} : f64[4,3]
  return(%e, %s, %c)
}"""
    module = placed(text)
    assert result_placements(module) == ["[S(0),S(2)]", "[S(0),S(1)]", "[S(0),R]"]
    x = np.random.default_rng(4).standard_normal((4, 6))
    e, s, c = simulate(module, x)
    np.testing.assert_allclose(e, x[:, None, :], **TOL)
    np.testing.assert_allclose(s, x, **TOL)
    np.testing.assert_allclose(c, x[:, ::2], **TOL)


@pytest.mark.parametrize("table, expected", [
    ("[S(0),R]", "[P(sum),R]"), ("[R,S(1)]", "[R,S(2)]"), ("[S(0),S(1)]", "[P(sum),S(2)]"),
    ("[S(0),S(0)]", "[P(sum),P(sum)]")])
def test_embedding_vocab_parallel_gives_partial_sums(table, expected) -> None:
    text = f"""mesh @m [a=2, b=2]
func @main(%w: f64[8,4] @m{table}, %ids: i64[3,5] @m[R,R]) -> (f64[3,5,4], f64[3,5,4]) {{
  %e = gather(%w, %ids) {{axis = 0}} : f64[3,5,4]
  %r = tanh(%e) : f64[3,5,4]
  return(%e, %r)
}}"""
    module = placed(text)
    assert result_placements(module) == [expected, expected.replace("P(sum)", "R")]
    rng = np.random.default_rng(5)
    w, ids = rng.standard_normal((8, 4)), rng.integers(-8, 8, (3, 5))
    e, r = simulate(module, w, ids)
    np.testing.assert_allclose(e, w[ids], **TOL)
    np.testing.assert_allclose(r, np.tanh(w[ids]), **TOL)


def sdpa(q, k, v, causal=False):
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("q_place, kv_place, causal, expected", [
    ("[S(0),S(1)]", "[S(0),S(1)]", True, "[S(0),S(1)]"),   # batch and GQA heads
    ("[R,S(2)]", "[R,R]", False, "[R,S(2)]"),              # query positions
    ("[R,S(2)]", "[R,R]", True, "[R,R]"),                  # ... not under a causal mask
    ("[R,S(3)]", "[R,S(3)]", False, "[R,R]"),              # q/k features: no rule
])
def test_attention_splits_batch_heads_and_queries(q_place, kv_place, causal, expected) -> None:
    text = f"""mesh @m [a=2, b=2]
func @main(%q: f64[2,4,6,4] @m{q_place}, %k: f64[2,2,6,4] @m{kv_place},
           %v: f64[2,2,6,4] @m{kv_place}) -> (f64[2,4,6,4]) {{
  %o = scaled_dot_product_attention(%q, %k, %v) {{is_causal = {str(causal).lower()},
       enable_gqa = true}} : f64[2,4,6,4]
  return(%o)
}}"""
    module = placed(text)
    assert result_placements(module) == [expected]
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4)))
    np.testing.assert_allclose(simulate(module, q, k, v)[0], sdpa(q, k, v, causal), **TOL)


@pytest.mark.parametrize("place, mask_place", [("[S(1),R]", "[S(1),R]"),   # heads
                                              ("[R,S(0)]", "[R,R]")])     # broadcast batch
def test_attention_with_a_mask_splits_heads_and_batch(place, mask_place) -> None:
    text = f"""mesh @m [a=2, b=2]
func @main(%q: f64[2,4,6,3] @m{place}, %k: f64[2,4,6,3] @m{place}, %v: f64[2,4,6,3] @m{place},
           %mask: f64[1,4,6,6] @m{mask_place}) -> (f64[2,4,6,3]) {{
  %o = scaled_dot_product_attention(%q, %k, %v, %mask) : f64[2,4,6,3]
  return(%o)
}}"""
    module = placed(text)
    assert result_placements(module) == [place]
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 4, 6, 3)) for _ in range(3))
    mask = rng.standard_normal((1, 4, 6, 6))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(3) + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(simulate(module, q, k, v, mask)[0], want, **TOL)


@pytest.mark.parametrize("a_place, b_place, expected", [
    ("[S(0),R]", "[S(0),S(2)]", "[S(0),S(2)]"), ("[R,S(2)]", "[R,S(1)]", "[R,P(sum)]")])
def test_batched_matmul_splits_the_batch(a_place, b_place, expected) -> None:
    text = f"""mesh @m [a=2, b=2]
func @main(%a: f64[4,6,8] @m{a_place}, %b: f64[4,8,2] @m{b_place}) -> (f64[4,6,2]) {{
  %y = matmul(%a, %b) : f64[4,6,2]
  return(%y)
}}"""
    module = placed(text)
    assert result_placements(module) == [expected]
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((4, 6, 8)), rng.standard_normal((4, 8, 2))
    np.testing.assert_allclose(simulate(module, a, b, rng=rng)[0], a @ b, **TOL)
