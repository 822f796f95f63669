"""bucket-all-reduces on per-rank programs: small independent all_reduces of one axis are sent
as one, the ranks' outputs still match float64 NumPy on random inputs, the alpha-beta model
prices fewer message steps for the same bytes, and dependent, large, other-axis or other-kind
all_reduces stay apart."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed.spmd_models import partitioned, run_spmd
from tilefold.distributed import AlphaBeta, BucketAllReduces
from tilefold.errors import PassError
from tilefold.ir import parse_module, verify
from tilefold.passes import run_pipeline

GRADS = """mesh @m [dp=2, tp=2]
func @main(%g1: f64[4,8] @m[P(sum),S(1)], %g2: f64[8] @m[P(sum),R], %g3: f64[] @m[P(sum),R],
           %g4: f64[8] @m[P(sum),R], %h: f64[6] @m[R,P(sum)], %m: f64[6] @m[R,P(max)],
           %big: f64[32,32] @m[P(sum),R], %g5: f64[2,3] @m[P(sum),R])
    -> (f64[4,8] @m[R,S(1)], f64[8] @m[R,R], f64[] @m[R,R], f64[8] @m[R,R], f64[6] @m[R,R],
        f64[6] @m[R,R], f64[32,32] @m[R,R], f64[2,3] @m[R,R]) {
  %r1 = all_reduce(%g1) {axis = "dp"} : f64[4,8] @m[R,S(1)]
  %r2 = all_reduce(%g2) {axis = "dp"} : f64[8] @m[R,R]
  %r3 = all_reduce(%g3) {axis = "dp"} : f64[] @m[R,R]
  %p = mul(%r2, %g4) : f64[8] @m[P(sum),R]
  %q = all_reduce(%p) {axis = "dp"} : f64[8] @m[R,R]
  %rh = all_reduce(%h) {axis = "tp"} : f64[6] @m[R,R]
  %rm = all_reduce(%m) {axis = "tp"} : f64[6] @m[R,R]
  %rb = all_reduce(%big) {axis = "dp"} : f64[32,32] @m[R,R]
  %r5 = all_reduce(%g5) {axis = "dp"} : f64[2,3] @m[R,R]
  return(%r1, %r2, %r3, %q, %rh, %rm, %rb, %r5)
}"""
SHAPES = [(4, 8), (8,), (), (8,), (6,), (6,), (32, 32), (2, 3)]


def reductions(module) -> list[tuple[str, tuple[int, ...]]]:
    return [(op.attr("axis"), op.result.type.shape) for op in module["main"].ops
            if op.name == "spmd.all_reduce"]


def alpha_beta(module) -> tuple[float, float]:
    """Seconds and bytes the alpha-beta model gives the program's all_reduces."""
    cost = AlphaBeta(module.meshes["m"])
    items = [cost.collective("all_reduce", np.prod(op.result.type.shape) * 8, op.attr("axis"))
             for op in module["main"].ops if op.name == "spmd.all_reduce"]
    return sum(i.seconds for i in items), sum(i.comm_bytes for i in items)


def test_small_gradients_are_sent_in_buckets_and_match_numpy() -> None:
    global_ = verify(parse_module(GRADS))
    per_rank = partitioned(global_)
    before = reductions(per_rank)
    run_pipeline(per_rank, "bucket-all-reduces{threshold=4096}")
    verify(per_rank)
    # r1 (a [4,4] block), r2 and r3 share a bucket; q uses r2, so it opens the next one,
    # which r5 joins; the tp sum, the tp max and the 8 KiB block stay alone
    assert reductions(per_rank) == [("dp", (25,)), ("tp", (6,)), ("tp", (6,)), ("dp", (32, 32)),
                                    ("dp", (14,))]
    assert len(before) == 8
    rng = np.random.default_rng(9)
    arrays = [rng.normal(size=s) for s in SHAPES]
    g1, g2, g3, g4, h, m, big, g5 = arrays
    want = [g1, g2, g3, g2 * g4, h, m, big, g5]
    for program in (partitioned(global_), per_rank):
        for got, w in zip(run_spmd(global_, program, arrays, rng), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12)
    seconds, moved = alpha_beta(per_rank)
    old_seconds, old_moved = alpha_beta(partitioned(global_))
    assert moved == pytest.approx(old_moved) and seconds < old_seconds


def test_the_cap_and_the_threshold_are_options() -> None:
    per_rank = partitioned(verify(parse_module(GRADS)))
    bucketing = BucketAllReduces(threshold=100, bucket_cap=100)
    bucketing.run(per_rank)
    verify(per_rank)
    # r1's 128-byte block is over the threshold; r2 (64 B) and r3 (8 B) fit one 100-byte
    # bucket; r5 (48 B) would overflow q's (64 B) and goes alone
    assert bucketing.stats == {"num-packed": 2, "num-buckets": 1}
    assert ("dp", (9,)) in reductions(per_rank)
    with pytest.raises(PassError, match="threshold"):
        run_pipeline(per_rank, "bucket-all-reduces{threshold=lots}")


def test_a_global_program_is_left_alone() -> None:
    module = verify(parse_module(GRADS))
    run_pipeline(module, "bucket-all-reduces")
    assert [op.name for op in module["main"].ops].count("all_reduce") == 8
