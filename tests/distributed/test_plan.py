"""Plans: the strategies' plans for GPT-2 and LLaMA blocks run on the simulated mesh and match
float64 NumPy; Megatron emits 2 all_reduces per block (TP+SP: 2 all_gathers and 2
reduce_scatters); plans print, parse back exactly, can be edited, and bad plans are named."""

from __future__ import annotations

import blockref
import numpy as np
import pytest

from tilefold.distributed import (
    AlphaBeta,
    BlockShape,
    Constraints,
    Plan,
    PlanError,
    gpt2,
    llama,
    nbytes,
    parse_mesh,
    search,
    simulate,
)
from tilefold.distributed.strategies import StrategyError
from tilefold.ir import parse_module, print_module
from tilefold.ir.types import Replicate

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "local_slice")
SMALL = BlockShape(d=16, heads=4, kv_heads=2, ffn=32, batch=2, seq=4, layers=2, dtype="f64")
BLOCKS = {
    "gpt2": (lambda s: gpt2(s), lambda p, s: blockref.gpt2(p, s)),
    "gpt2-fused": (lambda s: gpt2(s, fused_qkv=True), lambda p, s: blockref.gpt2(p, s, True)),
    "llama": (llama, blockref.llama),
}


def collectives(module) -> dict[str, int]:
    names = [op.name for op in module["main"].ops]
    return {c: names.count(c) for c in COLLECTIVES if names.count(c)}


def random_params(module, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {a.name: rng.standard_normal(a.type.shape) * (0.3 if a.type.rank == 2 else 1.0)
            for a in module["main"].args}


def megatron_memory(module, mesh) -> int:
    placed = search(module, mesh, "megatron").place(module)
    return sum(nbytes(a.type) for a in placed["main"].args)


@pytest.mark.parametrize("block", sorted(BLOCKS))
@pytest.mark.parametrize("strategy", ["megatron", "megatron-sp", "dp", "ilp", "ilp-limited"])
def test_every_strategy_matches_numpy_on_the_simulated_mesh(block, strategy) -> None:
    build, reference = BLOCKS[block]
    shape = SMALL if block == "llama" else BlockShape(**{**SMALL.__dict__, "kv_heads": None})
    module = build(shape)
    mesh = parse_mesh("dp=2,tp=2")
    constraints = Constraints()
    if strategy == "ilp-limited":  # weights must be split: the search has to move data
        constraints = Constraints(memory_limit=megatron_memory(module, mesh))
    plan = search(module, mesh, strategy.removesuffix("-limited"), AlphaBeta(mesh), constraints)
    partitioned = plan.apply(module)
    prm = random_params(module, seed=len(block) + len(strategy))
    (got,) = simulate(partitioned, *(prm[a.name] for a in module["main"].args),
                      rng=np.random.default_rng(0))
    np.testing.assert_allclose(got, reference(prm, shape), rtol=1e-10, atol=1e-10)
    if strategy == "ilp-limited":
        placed = plan.place(module)
        assert sum(nbytes(a.type) for a in placed["main"].args) <= constraints.memory_limit


@pytest.mark.parametrize("strategy", ["megatron", "megatron-sp", "dp", "ilp"])
def test_llama_with_gqa_on_8_simulated_ranks(strategy) -> None:
    shape = BlockShape(d=32, heads=8, kv_heads=4, ffn=32, batch=2, seq=4, dtype="f64")
    module = llama(shape)
    mesh = parse_mesh("dp=2,tp=4")
    plan = search(module, mesh, strategy, AlphaBeta(mesh),
                  Constraints(memory_limit=megatron_memory(module, mesh)))
    prm = random_params(module, seed=len(strategy))
    (got,) = simulate(plan.apply(module), *(prm[a.name] for a in module["main"].args),
                      rng=np.random.default_rng(1))
    np.testing.assert_allclose(got, blockref.llama(prm, shape), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_megatron_emits_two_all_reduces_per_block_and_sp_two_gathers_two_scatters(block) -> None:
    shape = BlockShape(d=1024, heads=16, kv_heads=8 if block == "llama" else None, batch=8,
                       seq=1024, layers=3)
    module = BLOCKS[block][0](shape)
    for axes in ("tp=8", "dp=2,tp=4"):
        mesh = parse_mesh(axes)
        tp = search(module, mesh, "megatron").apply(module)
        assert collectives(tp) == {"all_reduce": 2 * shape.layers}
        sp = search(module, mesh, "megatron-sp").apply(module)
        assert collectives(sp) == {"all_gather": 2 * shape.layers,
                                   "reduce_scatter": 2 * shape.layers}
        assert collectives(search(module, mesh, "dp").apply(module)) == {}
    types = {op.results[0].name: str(op.results[0].type) for op in tp["main"].ops[:-1]}
    assert types["l0_q" if block != "gpt2-fused" else "l0_qkv"].endswith("@m[S(0),S(1)]")
    assert types["l0_sdpa"].endswith("@m[S(0),S(1)]")
    assert types["l0_o"] == "f32[8192,1024] @m[S(0),P(sum)]"


@pytest.mark.parametrize("strategy", ["megatron", "megatron-sp", "dp", "ilp", "propagate"])
def test_plans_print_and_parse_back_exactly(strategy) -> None:
    module = gpt2(BlockShape(layers=2))
    mesh = parse_mesh("mesh @grid [dp=2, tp=4]")
    plan = search(module, mesh, strategy)
    assert Plan.parse(plan.text) == plan
    assert plan.text.splitlines()[:2] == [f"# strategy: {strategy}", "mesh @grid [dp=2, tp=4]"]
    assert print_module(plan.apply(module)) == print_module(Plan.parse(plan.text).apply(module))


def test_an_edited_plan_is_applied_as_written() -> None:
    shape = BlockShape(dtype="f64")
    module = gpt2(shape)
    mesh = parse_mesh("tp=2")
    text = search(module, mesh, "megatron").text
    edited = Plan.parse(text.replace("%l0_fc2_w: @m[S(0)]", "%l0_fc2_w: @m[R]  # whole")
                        + "%l0_gelu: @m[R]  # gathered where it is made\n")
    assert edited["l0_fc2_w"] == edited["l0_gelu"] == (Replicate(),)
    partitioned = edited.apply(module)
    assert collectives(partitioned) == {"all_reduce": 1, "all_gather": 1}
    prm = random_params(module, seed=3)
    (got,) = simulate(partitioned, *(prm[a.name] for a in module["main"].args))
    np.testing.assert_allclose(got, blockref.gpt2(prm, shape), rtol=1e-10, atol=1e-10)


def test_propagate_keeps_the_annotations_and_derives_the_rest() -> None:
    text = """mesh @m [tp=2]
func @main(%x: f64[4,8] @m[R], %w1: f64[8,16] @m[S(1)], %w2: f64[16,8] @m[S(0)]) -> (f64[4,8]) {
  %h = matmul(%x, %w1) : f64[4,16]
  %g = gelu(%h) : f64[4,16] @m[R]
  %o = matmul(%g, %w2) : f64[4,8]
  return(%o)
}"""
    module = parse_module(text)
    plan = search(module, module.meshes["m"], "propagate")
    assert plan.text.splitlines()[2:] == ["%x: @m[R]", "%w1: @m[S(1)]", "%w2: @m[S(0)]",
                                          "%g: @m[R]"]
    partitioned = plan.apply(module)
    assert collectives(partitioned) == {"all_gather": 2}  # %g as annotated, then %w2 for it
    rng = np.random.default_rng(4)
    x, w1, w2 = rng.standard_normal((4, 8)), rng.standard_normal((8, 16)), rng.standard_normal(
        (16, 8))
    (got,) = simulate(partitioned, x, w1, w2)
    np.testing.assert_allclose(got, blockref.gelu(x @ w1) @ w2, rtol=1e-12, atol=1e-12)
    with pytest.raises(StrategyError, match=r"placed on mesh @m \[tp=2\], but the plan is for"):
        search(module, parse_mesh("tp=4"), "propagate")


@pytest.mark.parametrize("text, message", [
    ("%x: @m[R]\n", "after the mesh line"),
    ("# only a comment\n", "plan has no mesh line"),
    ("mesh @m [tp=2]\n%x: @m[R]\n%x: @m[S(0)]\n", r"places %x twice"),
    ("mesh @m [tp=2]\n%x: @m[R,R]\n", "2 placements for the 1 axes"),
    ("mesh @m [tp=2]\n%x: @m[Q]\n", "plan line 2: placement 'Q' is not R"),
    ("mesh @m [tp=2]\n%x: @n[R]\n", r"plan line 2: '%x: @n\[R\]'"),
    ("mesh @m [tp]\n", "write axes as name=size"),
])
def test_bad_plan_text_is_named(text, message) -> None:
    with pytest.raises(PlanError, match=message):
        Plan.parse(text)


def test_a_plan_that_does_not_fit_the_module_is_named() -> None:
    module = gpt2(BlockShape())
    with pytest.raises(PlanError, match=r"places %nope, which @main does not have"):
        Plan.parse("mesh @m [tp=2]\n%nope: @m[R]\n").apply(module)
    with pytest.raises(PlanError, match=r"%x: f32\[16,64\] @m\[S\(0\)\]: dim 0 \(16\) does not "
                       "split evenly over axis tp=32"):
        Plan.parse("mesh @m [tp=32]\n%x: @m[S(0)]\n").apply(module)
    with pytest.raises(StrategyError, match="unknown strategy 'alpa'; known: dp, ilp"):
        search(module, parse_mesh("tp=2"), "alpa")
