"""split-all-reduce on the simulated mesh: GPT-2- and LLaMA-style blocks under tensor
parallelism give float64 NumPy's answer, global and per rank, with each all_reduce turned into
reduce_scatter + all_gather around the residual adds and the norm; the cost model's estimate
drops (same bytes, less compute) and a model that prices the pair above the all_reduce keeps it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed.spmd_models import (
    block_inputs,
    block_text,
    llama_inputs,
    llama_text,
    numpy_block,
    numpy_llama,
    partitioned,
    placed,
    run_spmd,
)
from tilefold.distributed import AlphaBeta, Estimate, SplitAllReduce, simulate
from tilefold.errors import TilefoldError
from tilefold.ir import parse_module, print_module, verify
from tilefold.passes import run_pipeline

BLOCKS = {"gpt2": (block_text, block_inputs, numpy_block),
          "llama": (llama_text, llama_inputs, numpy_llama)}


def kinds(module) -> list[str]:
    return [op.name for op in module["main"].ops if op.has_trait("collective")
            and op.name != "local_slice"]


@pytest.mark.parametrize(("block", "mesh"), [("gpt2", "tp2"), ("llama", "dp2tp2")])
def test_blocks_split_their_all_reduces_and_match_numpy(block: str, mesh: str) -> None:
    text, inputs, meaning = BLOCKS[block]
    module = placed(text(mesh))
    before = verify(parse_module(print_module(module)))
    run_pipeline(module, "split-all-reduce")
    verify(module)
    assert "all_reduce" in kinds(before) and "all_reduce" not in kinds(module)
    assert kinds(module).count("reduce_scatter") == kinds(before).count("all_reduce")
    arrays = inputs(np.random.default_rng(11))
    want = meaning(*arrays)
    (got,) = simulate(module, *arrays)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    (ranks,) = run_spmd(module, partitioned(module), arrays)
    np.testing.assert_allclose(ranks, want, rtol=1e-10, atol=1e-10)
    cost = AlphaBeta(module.meshes["m"])
    old, new = cost.estimate(before["main"]), cost.estimate(module["main"])
    assert new.comm_bytes == pytest.approx(old.comm_bytes)
    assert new.by_kind()["compute"].flops < old.by_kind()["compute"].flops
    assert new.seconds < old.seconds


TAIL = """mesh @m [tp=2]
func @main(%p: f64[6,8] @m[P(sum)], %b: f64[8] @m[R], %x: f64[6,8] @m[R], %g: f64[8] @m[R])
    -> (f64[6,8] @m[R]) {
  %s = all_reduce(%p) {axis = "tp"} : f64[6,8] @m[R]
  %a = add(%s, %b) : f64[6,8] @m[R]
  %h = add(%a, %x) : f64[6,8] @m[R]
  %n = rms_norm(%h, %g) {eps = 1e-6} : f64[6,8] @m[R]
  return(%n)
}"""


def numpy_tail(p, b, x, g):
    h = p + b + x
    return h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + 1e-6) * g


class TreeAllReduce(AlphaBeta):
    """An all_reduce at a quarter of the ring's price (a tree on small messages, say)."""

    def collective(self, kind: str, nbytes: float, axis: str, what: str = "") -> Estimate:
        est = super().collective(kind, nbytes, axis, what)
        return est.scaled(0.25, "(tree)") if kind == "all_reduce" else est


class PricedByTree(SplitAllReduce):
    def cost_model(self, mesh):
        return TreeAllReduce(mesh)


def test_the_cost_model_decides() -> None:
    module = verify(parse_module(TAIL))
    kept = PricedByTree()
    kept.run(module)
    assert kinds(module) == ["all_reduce"] and kept.stats["num-kept"] == 1
    split = SplitAllReduce()
    split.run(module)
    verify(module)
    assert kinds(module) == ["reduce_scatter", "all_gather"]
    assert split.stats == {"num-split": 1, "num-kept": 0, "num-sharded-ops": 3}
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(6, 8)), rng.normal(size=8), rng.normal(size=(6, 8)),
              rng.normal(size=8)]
    (got,) = simulate(module, *arrays, rng=rng)
    np.testing.assert_allclose(got, numpy_tail(*arrays), rtol=1e-12, atol=1e-12)


def test_an_uneven_dim_or_a_normalized_dim_is_not_split() -> None:
    # 3 rows do not split over 2 devices; the features do, but rms_norm normalizes them: the
    # chain is cut before the norm (the adds still run on blocks of features)
    module = verify(parse_module(TAIL.replace("6,8", "3,8")))
    run_pipeline(module, "split-all-reduce")
    verify(module)
    ops = {op.result.name: op for op in module["main"].ops if op.results}
    assert ops["s"].name == "reduce_scatter" and ops["s"].attr("dim") == 1
    assert ops["h"].name == "all_gather" and ops["n"].operands[0] is ops["h"].result
    rng = np.random.default_rng(4)
    arrays = [rng.normal(size=(3, 8)), rng.normal(size=8), rng.normal(size=(3, 8)),
              rng.normal(size=8)]
    (got,) = simulate(module, *arrays, rng=rng)
    np.testing.assert_allclose(got, numpy_tail(*arrays), rtol=1e-12, atol=1e-12)


def test_a_reduced_value_used_twice_or_by_a_matmul_stays() -> None:
    text = """mesh @m [tp=2]
func @main(%p: f64[4,4] @m[P(sum)], %w: f64[4,4] @m[R]) -> (f64[4,4] @m[R], f64[4,4] @m[R]) {
  %s = all_reduce(%p) {axis = "tp"} : f64[4,4] @m[R]
  %y = matmul(%s, %w) : f64[4,4] @m[R]
  %q = all_reduce(%p) {axis = "tp"} : f64[4,4] @m[R]
  %z = add(%q, %q) : f64[4,4] @m[R]
  %u = neg(%q) : f64[4,4] @m[R]
  return(%y, %u)
}"""
    module = verify(parse_module(text))
    run_pipeline(module, "split-all-reduce")
    assert print_module(module) == print_module(verify(parse_module(text)))


def test_optimize_collectives_merges_then_splits() -> None:
    text = """mesh @m [tp=2]
func @main(%p: f64[6,8] @m[P(sum)], %q: f64[6,8] @m[P(sum)], %g: f64[8] @m[R])
    -> (f64[6,8] @m[R]) {
  %a = all_reduce(%p) {axis = "tp"} : f64[6,8] @m[R]
  %b = all_reduce(%q) {axis = "tp"} : f64[6,8] @m[R]
  %h = add(%a, %b) : f64[6,8] @m[R]
  %n = rms_norm(%h, %g) {eps = 1e-6} : f64[6,8] @m[R]
  return(%n)
}"""
    module = verify(parse_module(text))
    run_pipeline(module, "optimize-collectives")
    verify(module)
    assert kinds(module) == ["reduce_scatter", "all_gather"]
    rng = np.random.default_rng(12)
    p, q, g = rng.normal(size=(6, 8)), rng.normal(size=(6, 8)), rng.normal(size=8)
    (got,) = simulate(module, p, q, g, rng=rng)
    np.testing.assert_allclose(got, numpy_tail(p + q, 0.0, 0.0, g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("options", "message"), [
    ("device=tpu", "no such device; known: a100, h100, h200, mi300x, cpu"),
    ("link=carrier-pigeon", "unknown link class 'carrier-pigeon'"),
])
def test_unknown_devices_and_links_are_named(options: str, message: str) -> None:
    module = verify(parse_module(TAIL))
    with pytest.raises(TilefoldError, match=message):
        run_pipeline(module, f"split-all-reduce{{{options}}}")
