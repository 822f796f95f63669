"""The reshape sharding rule on random reshapes and placements: whatever propagate-sharding
derives, the per-rank program (local reshape targets) and the simulated global program both
give NumPy's reshape; a split the result cannot follow is an error naming it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.spmd_models import partitioned, run_spmd
from tilefold.distributed import simulate
from tilefold.errors import TilefoldError
from tilefold.ir import parse_module, verify
from tilefold.passes import run_pipeline

SHAPES = [(8, 6), (2, 4, 6), (4, 12), (48,), (1, 8, 6), (2, 2, 2, 6), (8, 3, 2), (6, 8),
          (4, 1, 12), (16, 3)]


@st.composite
def reshapes(draw):
    src = draw(st.sampled_from(SHAPES))
    dst = draw(st.sampled_from(SHAPES))
    sizes = [draw(st.sampled_from([1, 2, 4])) for _ in range(2)]
    places = [draw(st.sampled_from(["R", *(f"S({d})" for d in range(len(src)))]))
              for _ in sizes]
    return src, dst, sizes, places


def text_of(src, dst, sizes, places) -> str:
    def ty(shape):
        return f"f64[{','.join(map(str, shape))}]"

    return (f"mesh @m [a={sizes[0]}, b={sizes[1]}]\n"
            f"func @main(%x: {ty(src)} @m[{','.join(places)}]) -> ({ty(dst)}) {{\n"
            f"  %y = reshape(%x) {{shape = [{', '.join(map(str, dst))}]}} : {ty(dst)}\n"
            "  %z = neg(%y) : " + ty(dst) + "\n  return(%z)\n}")


@settings(max_examples=80, deadline=None)
@given(reshapes(), st.integers(0, 2**32 - 1))
def test_random_reshapes_match_numpy(case, seed) -> None:
    src, dst, _, _ = case
    try:
        sharded = verify(parse_module(text_of(*case)))
        run_pipeline(sharded, "propagate-sharding,expand-redistribute")
    except TilefoldError as exc:  # the input placements themselves, or a split not followed
        assert "split evenly" in exc.message, exc.message
        return
    x = np.random.default_rng(seed).standard_normal(src)
    want = -x.reshape(dst)
    np.testing.assert_array_equal(simulate(sharded, x)[0], want)
    np.testing.assert_array_equal(run_spmd(sharded, partitioned(sharded), [x])[0], want)


def test_a_minor_dim_split_is_gathered_and_a_major_one_followed() -> None:
    minor = parse_module(text_of((8, 6), (48,), [1, 2], ["R", "S(1)"]))
    run_pipeline(minor, "propagate-sharding")
    assert [str(op.results[0].type) for op in minor["main"].ops[:2]] == [
        "f64[8,6] @m[R,R]", "f64[48] @m[R,R]"]
    major = parse_module(text_of((8, 6), (2, 4, 6), [2, 2], ["S(0)", "S(1)"]))
    run_pipeline(major, "propagate-sharding")
    assert str(major["main"].ops[0].result.type) == "f64[2,4,6] @m[S(0),S(2)]"
