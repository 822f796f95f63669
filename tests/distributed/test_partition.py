"""spmd-partition: the per-rank program of a placed function (local shapes, per-rank
collectives, local size attributes) run on every simulated rank equals float64 NumPy and the
simulated global program, for Megatron's MLP, a GPT-2-style block and a LLaMA-style block
under DP, TP and DP+TP."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed.spmd_models import (
    block_inputs,
    block_text,
    llama_inputs,
    llama_text,
    mlp_inputs,
    mlp_text,
    numpy_block,
    numpy_llama,
    numpy_mlp,
    partitioned,
    placed,
    run_spmd,
)
from tilefold.distributed import PartitionError, run_ranks, simulate
from tilefold.errors import TilefoldError, VerificationError
from tilefold.ir import parse_module, print_module, verify
from tilefold.passes import run_pipeline

ALL = ["dp2", "dp4", "dp8", "tp2", "tp4", "dp2tp2", "dp2tp4"]


def per_rank_ops(module) -> list[str]:
    return [op.name for op in module["main"].ops]


def test_the_mlp_per_rank_program_has_local_types_and_one_all_reduce() -> None:
    module = partitioned(placed(mlp_text("dp2tp4")))
    text = print_module(module)
    assert "@m[" not in text and "mesh @m [dp=2, tp=4]" in text
    fn = module["main"]
    assert [str(a.type) for a in fn.args] == ["f64[4,16]", "f64[16,8]", "f64[8]", "f64[8,16]",
                                              "f64[16]"]
    (reduce,) = [op for op in fn.ops if op.name.startswith("spmd.")]
    assert reduce.name == "spmd.all_reduce" and str(reduce.result.type) == "f64[4,16]"
    assert reduce.attrs == {"axis": "tp", "size": 4, "reduce": "sum"}
    assert print_module(verify(parse_module(text))) == text


@pytest.mark.parametrize("mesh", ALL)
def test_the_mlp_ranks_match_numpy_and_the_simulated_global_program(mesh) -> None:
    rng = np.random.default_rng(21)
    args = mlp_inputs(rng)
    global_ = placed(mlp_text(mesh))
    (got,) = run_spmd(global_, partitioned(global_), args)
    np.testing.assert_allclose(got, numpy_mlp(*args), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, simulate(global_, *args)[0], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("sdpa", [False, True], ids=["matmul-softmax", "sdpa"])
@pytest.mark.parametrize("mesh", ALL)
def test_the_gpt_block_ranks_match_numpy_and_the_simulated_global_program(mesh, sdpa) -> None:
    rng = np.random.default_rng(7)
    args = block_inputs(rng, sdpa=sdpa)
    global_ = placed(block_text(mesh, sdpa=sdpa))
    per_rank = partitioned(global_)
    reduces = [op for op in per_rank["main"].ops if op.name == "spmd.all_reduce"]
    assert len(reduces) == (2 if "tp" in mesh else 0)  # Megatron: one per half of the block
    assert all(op.attr("axis") == "tp" for op in reduces)
    assert not [n for n in per_rank_ops(per_rank) if n.startswith("spmd.") and
                n != "spmd.all_reduce"]
    (got,) = run_spmd(global_, per_rank, args)
    np.testing.assert_allclose(got, numpy_block(*args, sdpa=sdpa), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(got, simulate(global_, *args)[0], rtol=1e-13, atol=1e-13)


def test_the_head_split_reshape_gets_the_local_head_count() -> None:
    ops = {op.results[0].name: op for op in partitioned(placed(block_text("dp2tp4")))["main"].ops
           if op.results}
    assert ops["q2"].attr("shape") == (4, 4, 1, 16)  # 8 rows / dp 2, 4 heads / tp 4
    assert ops["a2"].attr("shape") == (4, 4, 16)


def test_more_tensor_parallel_ranks_than_heads_replicates_the_heads() -> None:
    """tp=8 cuts the 64 features in 8, but the 4 heads cannot follow: the ops whose split
    would be uneven run replicated (the sharding rules' fallback), and the ranks still match
    NumPy."""
    text = block_text("tp4").replace("mesh @m [tp=4]", "mesh @m [tp=8]")
    global_ = placed(text)
    heads = [op for op in global_["main"].ops if op.name == "reshape" and op.result.type.rank == 4]
    assert heads and all("S(" not in str(op.result.type) for op in heads)
    args = block_inputs(np.random.default_rng(4))
    (got,) = run_spmd(global_, partitioned(global_), args)
    np.testing.assert_allclose(got, numpy_block(*args), rtol=1e-11, atol=1e-11)


COLLECTIVES = """mesh @m [dp=2, tp=2]
func @main(%x: f64[4,8] @m[S(0),S(1)], %p: f64[4,8] @m[R,P(sum)], %q: f64[4,8] @m[R,P(max)])
    -> (f64[4,8] @m[S(0),R], f64[4,8] @m[R,S(1)], f64[4,8] @m[S(0),S(0)],
        f64[4,8] @m[S(0),S(1)], f64[4,8] @m[S(0),R], f64[4,8] @m[R,R]) {
  %g = all_gather(%x) {axis = "tp"} : f64[4,8] @m[S(0),R]
  %s = reduce_scatter(%p) {axis = "tp", dim = 1} : f64[4,8] @m[R,S(1)]
  %t = all_to_all(%x) {axis = "tp", dim = 0} : f64[4,8] @m[S(0),S(0)]
  %l = local_slice(%g) {axis = "tp", dim = 1} : f64[4,8] @m[S(0),S(1)]
  %b = broadcast(%g) {axis = "tp", root = 1} : f64[4,8] @m[S(0),R]
  %m = all_reduce(%q) {axis = "tp"} : f64[4,8] @m[R,R]
  return(%g, %s, %t, %l, %b, %m)
}"""


def test_every_collective_has_a_per_rank_form_that_moves_the_right_blocks() -> None:
    global_ = verify(parse_module(COLLECTIVES))
    per_rank = partitioned(global_)
    forms = {op.results[0].name: op for op in per_rank["main"].ops if op.results}
    assert forms["g"].name == "spmd.all_gather" and forms["g"].attrs["dim"] == 1
    assert str(forms["g"].result.type) == "f64[2,8]"
    assert forms["s"].attrs == {"axis": "tp", "dim": 1, "size": 2, "reduce": "sum"}
    assert str(forms["s"].result.type) == "f64[4,4]"
    assert forms["t"].attrs == {"axis": "tp", "dim": 0, "size": 2, "gather_dim": 1}
    assert str(forms["t"].result.type) == "f64[1,8]"
    assert forms["l"].name == "spmd.local_slice" and str(forms["l"].result.type) == "f64[2,4]"
    assert forms["b"].attrs["root"] == 1 and forms["m"].attrs["reduce"] == "max"
    rng = np.random.default_rng(3)
    x, p, q = (rng.standard_normal((4, 8)) for _ in range(3))
    got = run_spmd(global_, per_rank, [x, p, q], rng=rng)
    for name, value in zip("gstlbm", got, strict=True):
        np.testing.assert_allclose(value, q if name == "m" else p if name == "s" else x,
                                   rtol=1e-12, atol=1e-12, err_msg=name)


def test_a_permute_per_rank_rotates_the_blocks() -> None:
    text = """mesh @m [tp=4]
func @main(%x: f64[8] @m[S(0)]) -> (f64[8] @m[S(0)]) {
  %y = permute(%x) {axis = "tp", shift = 1} : f64[8] @m[S(0)]
  return(%y)
}"""
    per_rank = partitioned(verify(parse_module(text)))
    blocks = [np.array([2.0 * k, 2.0 * k + 1]) for k in range(4)]
    (out,) = run_ranks(per_rank, [blocks])
    for k in range(4):
        np.testing.assert_array_equal(out[k], blocks[(k - 1) % 4])


def test_a_constant_in_a_sharded_program_runs_everywhere() -> None:
    """A constant has no operands to derive placements from: it is replicated."""
    text = """mesh @m [tp=2]
func @main(%x: f64[4,2] @m[S(0)]) -> (f64[4,2] @m[S(0)]) {
  %c = constant() {value = dense<f64[2] [0.5, -3.0]>} : f64[2]
  %y = mul(%x, %c) : f64[4,2] @m[S(0)]
  return(%y)
}"""
    x = np.random.default_rng(2).standard_normal((4, 2))
    global_ = verify(parse_module(text))
    np.testing.assert_array_equal(simulate(global_, x)[0], x * np.array([0.5, -3.0]))
    np.testing.assert_array_equal(run_spmd(global_, partitioned(global_), [x])[0],
                                  x * np.array([0.5, -3.0]))


def test_a_redistribute_left_in_the_program_is_refused() -> None:
    module = parse_module(mlp_text("tp2"))
    run_pipeline(module, "propagate-sharding")
    with pytest.raises(PartitionError, match=r"is still high-level: run expand-redistribute"):
        run_pipeline(module, "spmd-partition")


def test_placements_the_rules_do_not_give_are_refused() -> None:
    text = """mesh @m [tp=2]
func @main(%x: f64[4] @m[P(sum)]) -> (f64[4] @m[P(sum)]) {
  %y = relu(%x) : f64[4] @m[P(sum)]
  return(%y)
}"""
    with pytest.raises(PartitionError, match=r"spmd-partition: 'relu' has operands placed "
                       r"\['\[P\(sum\)\]'\]"):
        run_pipeline(verify(parse_module(text)), "spmd-partition")


def test_a_per_rank_collective_refuses_placed_operands_and_uneven_splits() -> None:
    placed_operand = """mesh @m [tp=2]
func @main(%x: f64[4] @m[S(0)]) -> (f64[8]) {
  %y = spmd.all_gather(%x) {axis = "tp", size = 2, dim = 0} : f64[8]
  return(%y)
}"""
    with pytest.raises(VerificationError, match=r"carries no placement; got f64\[4\] @m"):
        verify(parse_module(placed_operand))
    uneven = """func @main(%x: f64[3]) -> (f64[1]) {
  %y = spmd.local_slice(%x) {axis = "tp", size = 2, dim = 0} : f64[1]
  return(%y)
}"""
    with pytest.raises(VerificationError, match=r"splits dim 0 \(3\) of f64\[3\] over 2 "
                       r"devices of axis tp: it does not split evenly"):
        verify(parse_module(uneven))


def test_per_rank_collectives_check_their_attributes_as_their_global_ops_do() -> None:
    same_dims = """func @main(%x: f64[2,4]) -> (f64[2,4]) {
  %y = spmd.all_to_all(%x) {axis = "tp", size = 2, dim = 1, gather_dim = 1} : f64[2,4]
  return(%y)
}"""
    with pytest.raises(VerificationError, match=r"'spmd.all_to_all' gather_dim 1: the global "
                       r"'all_to_all' takes a shard S\(i\) with i other than dim"):
        verify(parse_module(same_dims))
    far_root = """func @main(%x: f64[4]) -> (f64[4]) {
  %y = spmd.broadcast(%x) {axis = "tp", size = 2, root = 2} : f64[4]
  return(%y)
}"""
    with pytest.raises(VerificationError, match=r"'spmd.broadcast' root 2 is not a device of "
                       r"axis tp \(size 2\)"):
        verify(parse_module(far_root))


def test_a_per_rank_collective_alone_says_how_to_run_it() -> None:
    from tilefold.ir import interpret

    module = verify(parse_module("""func @main(%x: f64[4]) -> (f64[4]) {
  %y = spmd.all_reduce(%x) {axis = "tp", size = 2} : f64[4]
  return(%y)
}"""))
    with pytest.raises(TilefoldError, match=r"one rank alone cannot run it: run the per-rank "
                       r"program with tilefold.distributed.run_ranks"):
        interpret(module, np.ones(4))


def numpy_attention(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("q_place, kv_place, mask_place", [
    ("[S(1),R]", "[S(1),R]", "[R,R]"),       # heads on dp, with 2 query heads per kv head
    ("[R,S(2)]", "[R,R]", "[R,S(0)]"),       # query rows on tp: the mask's rows follow
    ("[S(0),S(1)]", "[S(0),S(1)]", "[R,R]"),  # batch and heads
])
def test_grouped_query_attention_splits_heads_and_query_rows(q_place, kv_place,
                                                              mask_place) -> None:
    text = f"""mesh @m [dp=2, tp=2]
func @main(%q: f64[2,4,4,8] @m{q_place}, %k: f64[2,2,6,8] @m{kv_place},
           %v: f64[2,2,6,8] @m{kv_place}, %mask: f64[4,6] @m{mask_place}) -> (f64[2,4,4,8]) {{
  %o = scaled_dot_product_attention(%q, %k, %v, %mask) {{enable_gqa = true}} : f64[2,4,4,8]
  return(%o)
}}"""
    global_ = placed(text)
    assert not [op for op in global_["main"].ops if op.name == "all_gather"]  # no rule refused
    rng = np.random.default_rng(9)
    args = [rng.standard_normal(s) for s in ((2, 4, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8), (4, 6))]
    (got,) = run_spmd(global_, partitioned(global_), args)
    np.testing.assert_allclose(got, numpy_attention(*args), rtol=1e-12, atol=1e-12)


def test_causal_attention_does_not_split_query_rows() -> None:
    """Causal masking counts rows from the first: a block of rows would mask the wrong keys."""
    text = """mesh @m [tp=2]
func @main(%q: f64[1,2,4,8] @m[S(2)], %k: f64[1,2,4,8] @m[R], %v: f64[1,2,4,8] @m[R])
    -> (f64[1,2,4,8]) {
  %o = scaled_dot_product_attention(%q, %k, %v) {is_causal = true} : f64[1,2,4,8]
  return(%o)
}"""
    global_ = placed(text)
    assert global_["main"].ops[0].name == "all_gather"
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    (got,) = run_spmd(global_, partitioned(global_), [q, k, v])
    np.testing.assert_allclose(got, numpy_attention(q, k, v, np.triu(np.full((4, 4), -np.inf),
                                                                       1)), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("mesh", ["dp4", "tp2", "dp2tp2"])
def test_a_llama_block_with_grouped_query_attention(mesh) -> None:
    """RMSNorm, 4 query heads on 2 key/value heads, SwiGLU: two all_reduces under TP."""
    rng = np.random.default_rng(12)
    args = llama_inputs(rng)
    global_ = placed(llama_text(mesh))
    per_rank = partitioned(global_)
    assert per_rank_ops(per_rank).count("spmd.all_reduce") == (2 if "tp" in mesh else 0)
    assert not [n for n in per_rank_ops(per_rank) if n.startswith("spmd.")
                and n != "spmd.all_reduce"]
    (got,) = run_spmd(global_, per_rank, args)
    np.testing.assert_allclose(got, numpy_llama(*args), rtol=1e-11, atol=1e-11)
