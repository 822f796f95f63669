"""Per-rank gather from a table split by rows (Megatron's vocab-parallel embedding): the
partitioned program looks up the ids in each rank's rows (offset by its spmd.axis_index),
writes zeros elsewhere, and the all_reduce after it gives float64 NumPy's lookup, negative
ids included, for tables split on one axis or two and ids split or not."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed.spmd_models import partitioned, placed, run_spmd
from tilefold.distributed import bind_rank, run_ranks, split
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.ir import interpret, parse_module, verify

CASES = [  # table placement, ids placement, ids dtype
    ("[S(0),R]", "[R,R]", "i64"),
    ("[R,S(0)]", "[S(0),R]", "i32"),
    ("[S(0),S(1)]", "[R,S(0)]", "i64"),
    ("[S(0),S(0)]", "[R,R]", "i32"),
]


@pytest.mark.parametrize(("table", "ids_at", "dt"), CASES)
def test_a_split_table_is_looked_up_per_rank(table: str, ids_at: str, dt: str) -> None:
    text = f"""mesh @m [a=2, b=2]
func @main(%w: f64[8,4] @m{table}, %ids: {dt}[4,3] @m{ids_at}) -> (f64[4,3,4], f64[4,3,4]) {{
  %e = gather(%w, %ids) {{axis = 0}} : f64[4,3,4]
  %r = tanh(%e) : f64[4,3,4]
  return(%e, %r)
}}"""
    global_ = placed(text)
    per_rank = partitioned(global_)
    names = [op.name for op in per_rank["main"].ops]
    assert "spmd.axis_index" in names and "spmd.all_reduce" in names
    rng = np.random.default_rng(8)
    w = rng.standard_normal((8, 4))
    ids = rng.integers(-8, 8, (4, 3)).astype(np.int64 if dt == "i64" else np.int32)
    e, r = run_spmd(global_, per_rank, [w, ids])
    np.testing.assert_allclose(e, w[ids], rtol=1e-12, atol=0)
    np.testing.assert_allclose(r, np.tanh(w[ids]), rtol=1e-12, atol=0)


def test_the_embedding_dim_is_gathered_from_a_table_split_two_ways() -> None:
    text = """mesh @m [tp=4]
func @main(%w: f32[16,6] @m[S(0)], %ids: i64[2,5] @m[R]) -> (f32[2,5,6]) {
  %e = gather(%w, %ids) {axis = 0} : f32[2,5,6]
  return(%e)
}"""
    global_ = placed(text)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 6)).astype(np.float32)
    ids = rng.integers(0, 16, (2, 5))
    (e,) = run_spmd(global_, partitioned(global_), [w, ids])
    np.testing.assert_array_equal(e, w.astype(np.float64)[ids].astype(np.float32))


def test_axis_index_is_each_ranks_coordinate_and_refused_alone() -> None:
    text = """mesh @m [a=2, b=3]
func @main() -> (i32[], i64[]) {
  %i = spmd.axis_index() {axis = "a", size = 2, dtype = i32} : i32[]
  %j = spmd.axis_index() {axis = "b", size = 3} : i64[]
  return(%i, %j)
}"""
    module = verify(parse_module(text))
    i, j = run_ranks(module, [])
    assert [int(x) for x in i] == [0, 0, 0, 1, 1, 1]
    assert [int(x) for x in j] == [0, 1, 2, 0, 1, 2]
    with pytest.raises(UnsupportedError, match="run_ranks, or make it one rank"):
        interpret(module, function="main")


def test_a_program_bound_to_each_rank_gives_that_ranks_block() -> None:
    text = """mesh @m [a=2, b=2]
func @main(%w: f64[8,4] @m[S(0),S(0)], %ids: i64[5] @m[R,R]) -> (f64[5,4] @m[P(sum),P(sum)]) {
  %e = gather(%w, %ids) {axis = 0} : f64[5,4] @m[P(sum),P(sum)]
  return(%e)
}"""
    global_ = verify(parse_module(text))
    per_rank = partitioned(global_)
    rng = np.random.default_rng(6)
    w, ids = rng.standard_normal((8, 4)), rng.integers(-8, 8, 5)
    blocks = [split(w, global_["main"].args[0].type, global_.meshes["m"]),
              split(ids, global_["main"].args[1].type, global_.meshes["m"])]
    (simulated,) = run_ranks(per_rank, blocks)
    alone = [interpret(bind_rank(per_rank, r), blocks[0][r], blocks[1][r])[0] for r in range(4)]
    for r in range(4):
        np.testing.assert_array_equal(alone[r], simulated[r])
        held = (np.where(ids < 0, ids + 8, ids) // 2) == r  # rank r holds rows 2r, 2r+1
        np.testing.assert_array_equal(alone[r], np.where(held[:, None], w[ids], 0.0))
    np.testing.assert_allclose(sum(alone), w[ids], rtol=1e-12, atol=0)


def test_narrow_ids_index_a_table_whose_offsets_they_cannot_hold() -> None:
    text = """mesh @m [tp=2]
func @main(%w: f64[512,2] @m[S(0)], %ids: u8[6] @m[R]) -> (f64[6,2]) {
  %e = gather(%w, %ids) {axis = 0} : f64[6,2]
  return(%e)
}"""
    global_ = placed(text)
    rng = np.random.default_rng(3)
    w, ids = rng.standard_normal((512, 2)), rng.integers(0, 256, 6).astype(np.uint8)
    (e,) = run_spmd(global_, partitioned(global_), [w, ids])
    np.testing.assert_allclose(e, w[ids], rtol=1e-12, atol=0)


@pytest.mark.parametrize("bad", [10, 11, 12, -11, -40])
def test_an_id_outside_the_table_is_refused_not_a_zero_row(bad: int) -> None:
    """10 rows over 4 ranks: blocks of 3, the last one padded (rows 10, 11 are padding, 12 is
    past every block). The unsplit lookup refuses each such id; the per-rank one must too."""
    text = """mesh @m [tp=4]
func @main(%w: f64[10,3] @m[S(0,pad)], %ids: i64[4] @m[R]) -> (f64[4,3]) {
  %e = gather(%w, %ids) {axis = 0} : f64[4,3]
  return(%e)
}"""
    global_ = placed(text)
    per_rank = partitioned(global_)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((10, 3))
    good = np.array([0, 9, -10, 4])
    (e,) = run_spmd(global_, per_rank, [w, good])
    np.testing.assert_array_equal(e, w[good])
    ids = good.copy()
    ids[2] = bad
    with pytest.raises(ShapeError, match="gather: index out of range"):
        interpret(global_, w, ids)
    with pytest.raises(ShapeError, match="gather: index out of range"):
        run_spmd(global_, per_rank, [w, ids])
