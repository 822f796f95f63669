"""Collectives on the simulated mesh: each rank's blocks against NumPy slicing and float64 sums
written out by hand, and the verifier's checks of each op's placements."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.distributed import assemble, run_ranks, scatter, simulate
from tilefold.errors import UnsupportedError, VerificationError
from tilefold.ir import interpret, parse_module, verify

MESH = "mesh @m [dp=2, tp=4]"
RANKS = [(i, j) for i in range(2) for j in range(4)]  # rank r sits at (r // 4, r % 4)


def one_op(x: str, op: str, out: str) -> str:
    return f"{MESH}\nfunc @main(%x: {x}) -> ({out}) {{\n  %y = {op} : {out}\n  return(%y)\n}}"


def run(text: str, blocks: list[np.ndarray]) -> list[np.ndarray]:
    (out,) = run_ranks(verify(parse_module(text)), [blocks])
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(17)


def test_all_gather_gives_each_rank_its_row_of_blocks(rng) -> None:
    x = rng.standard_normal((8, 16)).astype(np.float32)
    blocks = [x[4 * i : 4 * i + 4, 4 * j : 4 * j + 4] for i, j in RANKS]
    text = one_op("f32[8,16] @m[S(0),S(1)]", 'all_gather(%x) {axis = "tp"}',
                  "f32[8,16] @m[S(0),R]")
    for (i, _), got in zip(RANKS, run(text, blocks), strict=True):
        np.testing.assert_array_equal(got, x[4 * i : 4 * i + 4])


def test_all_reduce_sums_partials_over_its_axis_only(rng) -> None:
    parts = [rng.standard_normal((3, 5)) for _ in RANKS]
    text = one_op("f64[3,5] @m[R,P(sum)]", 'all_reduce(%x) {axis = "tp"}', "f64[3,5] @m[R,R]")
    for (i, _), got in zip(RANKS, run(text, parts), strict=True):
        want = parts[4 * i] + parts[4 * i + 1] + parts[4 * i + 2] + parts[4 * i + 3]
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)


def test_all_reduce_of_a_partial_max(rng) -> None:
    parts = [rng.standard_normal((3, 5)).astype(np.float32) for _ in RANKS]
    text = one_op("f32[3,5] @m[P(max),R]", 'all_reduce(%x) {axis = "dp"}', "f32[3,5] @m[R,R]")
    for (_, j), got in zip(RANKS, run(text, parts), strict=True):
        np.testing.assert_array_equal(got, np.maximum(parts[j], parts[4 + j]))


def test_reduce_scatter_leaves_each_rank_its_block_of_the_sum(rng) -> None:
    parts = [rng.standard_normal((2, 8)) for _ in RANKS]
    text = one_op("f64[2,8] @m[R,P(sum)]", 'reduce_scatter(%x) {axis = "tp", dim = 1}',
                  "f64[2,8] @m[R,S(1)]")
    for (i, j), got in zip(RANKS, run(text, parts), strict=True):
        total = sum(parts[4 * i + k] for k in range(4))
        np.testing.assert_allclose(got, total[:, 2 * j : 2 * j + 2], rtol=1e-15, atol=1e-15)


def test_all_to_all_moves_the_split_from_columns_to_rows(rng) -> None:
    x = rng.standard_normal((8, 16)).astype(np.float32)
    blocks = [x[:, 4 * j : 4 * j + 4] for _, j in RANKS]
    text = one_op("f32[8,16] @m[R,S(1)]", 'all_to_all(%x) {axis = "tp", dim = 0}',
                  "f32[8,16] @m[R,S(0)]")
    for (_, j), got in zip(RANKS, run(text, blocks), strict=True):
        np.testing.assert_array_equal(got, x[2 * j : 2 * j + 2, :])


def test_broadcast_sends_the_roots_copy(rng) -> None:
    copies = [rng.standard_normal(4).astype(np.float32) for _ in RANKS]  # diverged replicas
    text = one_op("f32[4] @m[R,R]", 'broadcast(%x) {axis = "dp", root = 1}', "f32[4] @m[R,R]")
    for (_, j), got in zip(RANKS, run(text, copies), strict=True):
        np.testing.assert_array_equal(got, copies[4 + j])


def test_permute_is_a_ring_step(rng) -> None:
    blocks = [rng.standard_normal((2, 3)).astype(np.float32) for _ in RANKS]
    text = one_op("f32[8,3] @m[R,S(0)]", 'permute(%x) {axis = "tp", shift = 3}',
                  "f32[8,3] @m[R,S(0)]")
    for (i, j), got in zip(RANKS, run(text, blocks), strict=True):
        np.testing.assert_array_equal(got, blocks[4 * i + (j - 3) % 4])
    with pytest.raises(UnsupportedError, match="run the function on the simulated mesh"):
        interpret(parse_module(text), np.zeros((8, 3), np.float32))


def test_local_slice_keeps_a_block_without_moving_data(rng) -> None:
    x = rng.standard_normal((3, 16)).astype(np.float32)
    text = one_op("f32[3,16] @m[R,R]", 'local_slice(%x) {axis = "dp", dim = 1}',
                  "f32[3,16] @m[S(1),R]")
    for (i, _), got in zip(RANKS, run(text, [x] * 8), strict=True):
        np.testing.assert_array_equal(got, x[:, 8 * i : 8 * i + 8])


def test_scatter_and_assemble_cut_nested_shards_in_mesh_order(rng) -> None:
    """[S(0),S(0)]: dp splits rows in halves, tp splits each half in quarters."""
    module = parse_module(f"{MESH}\nfunc @main(%x: f32[16,3] @m[S(0),S(0)]) -> "
                          "(f32[16,3] @m[S(0),S(0)]) { return(%x) }")
    t = module["main"].args[0].type
    x = rng.standard_normal((16, 3)).astype(np.float32)
    blocks = scatter(x, t)
    for r, (i, j) in enumerate(RANKS):
        np.testing.assert_array_equal(blocks[r], x[8 * i + 2 * j : 8 * i + 2 * j + 2])
    np.testing.assert_array_equal(assemble(blocks, t), x)


def test_random_partial_sums_add_up_to_the_value(rng) -> None:
    module = parse_module(f"{MESH}\nfunc @main(%x: f64[5] @m[P(sum),P(max)]) -> "
                          "(f64[5] @m[P(sum),P(max)]) { return(%x) }")
    t = module["main"].args[0].type
    x = rng.standard_normal(5)
    blocks = scatter(x, t, rng)
    assert len({b.tobytes() for b in blocks}) == 8  # every rank holds something different
    by_max = [np.max([blocks[4 * i + j] for j in range(4)], axis=0) for i in range(2)]
    np.testing.assert_allclose(by_max[0] + by_max[1], x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(simulate(module, x, rng=rng)[0], x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "x, op, out, message",
    [
        ("f32[8] @m[R,S(0)]", 'all_reduce(%x) {axis = "tp"}', "f32[8] @m[R,R]",
         r"'all_reduce' over axis tp takes a partial value P\(sum\|max\) there, but "
         r"f32\[8\] @m\[R,S\(0\)\] is S\(0\)"),
        ("f32[8] @m[R,P(sum)]", 'all_gather(%x) {axis = "tp"}', "f32[8] @m[R,R]",
         r"'all_gather' over axis tp takes a shard S\(dim\) there"),
        ("f32[8] @m[R,S(0)]", 'all_gather(%x) {axis = "pp"}', "f32[8] @m[R,R]",
         r"'all_gather': mesh @m \[dp=2, tp=4\] has no axis 'pp' \(it has: dp, tp\)"),
        ("f32[8]", 'all_gather(%x) {axis = "tp"}', "f32[8]",
         r"'all_gather' needs an operand placed on a mesh .*, got f32\[8\]"),
        ("f32[8] @m[S(0),S(0)]", 'all_gather(%x) {axis = "dp"}', "f32[8] @m[R,S(0)]",
         r"'all_gather' over axis dp changes how dim 0 of f32\[8\] @m\[S\(0\),S\(0\)\] is "
         r"split, but the later axis tp splits it too"),
        ("f32[6] @m[R,P(sum)]", 'reduce_scatter(%x) {axis = "tp", dim = 0}', "f32[6] @m[R,S(0)]",
         r"'reduce_scatter' result f32\[6\] @m\[R,S\(0\)\]: dim 0 \(6\) does not split "
         r"evenly over axis tp=4"),
        ("f32[8,8] @m[R,S(1)]", 'all_to_all(%x) {axis = "tp", dim = 1}', "f32[8,8] @m[R,S(1)]",
         r"'all_to_all' over axis tp takes a shard S\(i\) with i other than dim there"),
        ("f32[8] @m[R,R]", 'broadcast(%x) {axis = "dp", root = 2}', "f32[8] @m[R,R]",
         r"'broadcast' root 2 is not a device of axis dp \(size 2\)"),
        ("f32[8] @m[P(sum),P(max)]", 'all_reduce(%x) {axis = "dp"}', "f32[8] @m[R,P(max)]",
         r"'all_reduce' over axis dp reduces P\(sum\) of f32\[8\] @m\[P\(sum\),P\(max\)\], but "
         r"the later axis tp holds P\(max\): reduce that axis first"),
        ("f32[8] @m[P(sum),P(max)]", 'redistribute(%x) {placements = "[R,P(max)]"}',
         "f32[8] @m[R,P(max)]", r"cannot reduce axis dp's P\(sum\) while the later axis tp "
         r"stays P\(max\)"),
        ("f32[8] @m[R,S(0)]", 'redistribute(%x) {placements = "[P(sum),S(0)]"}',
         "f32[8] @m[P(sum),S(0)]", r"cannot make axis dp P\(sum\): only a partial value can "
         r"stay partial"),
        ("f32[8] @m[R,S(0)]", 'redistribute(%x) {placements = "[R]"}', "f32[8] @m[R]",
         r"'redistribute' result f32\[8\] @m\[R\]: 1 placements for the 2 axes"),
        ("f32[8] @m[R,S(0)]", 'redistribute(%x) {placements = "R,R"}', "f32[8] @m[R,R]",
         r"must be a bracketed list"),
        ("f32[8] @m[R,S(0)]", 'all_gather(%x) {axis = "tp"}', "f32[8] @m[R,S(0)]",
         r"result type f32\[8\] @m\[R,S\(0\)\] does not match the inferred f32\[8\] @m\[R,R\]"),
    ],
)
def test_collectives_check_their_placements(x, op, out, message) -> None:
    with pytest.raises(VerificationError, match=message):
        verify(parse_module(one_op(x, op, out)))
