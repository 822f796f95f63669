"""expand-redistribute on random meshes and placements: the collectives it writes leave every
rank holding exactly the block that the target placements assign it (NumPy slicing of the
input), and the global value unchanged."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefold.distributed import run_ranks, scatter, simulate
from tilefold.ir import parse_module, print_module, verify
from tilefold.ir.types import Mesh, Partial, Replicate, Shard, format_placements
from tilefold.passes import run_pipeline


@st.composite
def redistributions(draw):
    """A mesh, a rank-1..3 shape, source placements and target placements that both fit it
    (a target keeps each partial axis partial: nothing else can be made of it)."""
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    rank = draw(st.integers(1, 3))
    options = [Replicate(), *(Shard(d) for d in range(rank))]
    src = [draw(st.sampled_from([*options, Partial("sum"), Partial("max")])) for _ in sizes]
    dst: list = [None] * len(src)
    for a in reversed(range(len(src))):  # a partial reduced before a later partial of another
        p = src[a]                       # kind stays (redistribute refuses the others)
        kept = [q for q in dst[a + 1 :] if isinstance(q, Partial) and q != p]
        keep = isinstance(p, Partial) and (bool(kept) or draw(st.booleans()))
        dst[a] = p if keep else draw(st.sampled_from(options))
    shape = []
    for d in range(rank):
        need = [math.prod(n for n, p in zip(sizes, ps, strict=True) if p == Shard(d))
                for ps in (src, dst)]
        shape.append(math.lcm(*need) * draw(st.integers(1, 2)))
    return sizes, shape, src, dst


def module_text(sizes, shape, src, dst) -> str:
    mesh = Mesh("m", tuple((f"a{i}", n) for i, n in enumerate(sizes)))
    t = f"f64[{','.join(map(str, shape))}] @m"
    return (f"{mesh.declaration()}\nfunc @main(%x: {t}{format_placements(src)}) -> "
            f"({t}{format_placements(dst)}) {{\n"
            f'  %y = redistribute(%x) {{placements = "{format_placements(dst)}"}} : '
            f"{t}{format_placements(dst)}\n  return(%y)\n}}")


def expand(text: str):
    module = verify(parse_module(text))
    run_pipeline(module, "expand-redistribute")
    return verify(module)


@settings(max_examples=80, deadline=None)
@given(redistributions(), st.integers(0, 2**32 - 1))
def test_expanded_collectives_move_every_block_where_the_target_puts_it(case, seed) -> None:
    _, shape, _, dst = case
    expanded = expand(module_text(*case))
    printed = print_module(expanded)
    assert "redistribute" not in printed
    fn = expanded["main"]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    blocks = scatter(x, fn.args[0].type, rng)  # partial sums and maxes in random parts
    (out,) = run_ranks(expanded, [blocks])
    if not any(isinstance(p, Partial) for p in dst):
        want = scatter(x, fn.result_types[0])  # each rank's block of the target, by slicing
        for got, block in zip(out, want, strict=True):
            np.testing.assert_allclose(got, block, rtol=1e-13, atol=1e-13)
    (whole,) = simulate(expanded, x, rng=rng)
    np.testing.assert_allclose(whole, x, rtol=1e-13, atol=1e-13)


def test_each_single_axis_change_is_one_collective() -> None:
    cases = {
        ("R", "S(1)"): "local_slice", ("S(0)", "R"): "all_gather",
        ("P(sum)", "R"): "all_reduce", ("P(max)", "S(0)"): "reduce_scatter",
        ("S(0)", "S(1)"): "all_to_all",
    }
    for (a, b), op in cases.items():
        text = (f'mesh @m [tp=2]\nfunc @main(%x: f32[4,6] @m[{a}]) -> (f32[4,6] @m[{b}]) {{\n'
                f'  %y = redistribute(%x) {{placements = "[{b}]"}} : f32[4,6] @m[{b}]\n'
                "  return(%y)\n}")
        ops = [o.name for o in expand(text)["main"].ops]
        assert ops == [op, "return"], (a, b, ops)


def test_swapping_nested_shards_goes_through_a_gather() -> None:
    text = module_text([2, 2], [4, 4], [Shard(0), Shard(1)], [Shard(1), Shard(0)])
    ops = [o.name for o in expand(text)["main"].ops[:-1]]
    assert ops == ["all_gather", "all_to_all", "local_slice"]
