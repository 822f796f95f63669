"""Padded shards `S(d,pad)`: printed and parsed back exactly, accepted by the verifier where a
plain shard is an uneven-split error, and cut into blocks of ceil(size/n) rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefold.errors import ParseError, VerificationError
from tilefold.ir import parse_module, print_module, verify
from tilefold.ir.placements import assemble, scatter
from tilefold.ir.types import (
    Mesh,
    Replicate,
    Shard,
    Sharding,
    TensorType,
    local_shape,
    pad_uneven,
    parse_placements,
    sharding_problem,
)


@st.composite
def padded_types(draw) -> TensorType:
    """A random mesh (1 to 3 axes) and a type whose shards are padded where uneven (and at
    random where even)."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    mesh = Mesh("m", tuple((f"a{i}", n) for i, n in enumerate(sizes)))
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank))
    placements = [Shard(draw(st.integers(0, rank - 1)), draw(st.booleans()))
                  if draw(st.booleans()) else Replicate() for _ in sizes]
    t = TensorType.of("f64", shape).with_sharding(Sharding(mesh, tuple(placements)))
    return pad_uneven(t)


@settings(max_examples=40, deadline=None)
@given(padded_types())
def test_padded_placements_round_trip_and_verify(t: TensorType) -> None:
    assert sharding_problem(t) is None
    text = (f"{t.sharding.mesh.declaration()}\n"
            f"func @main(%x: {t}) -> ({t}) {{\n  %y = relu(%x) : {t}\n  return(%y)\n}}")
    module = verify(parse_module(text))
    printed = print_module(module)
    assert str(t) in printed
    again = verify(parse_module(printed))
    assert print_module(again) == printed
    assert again["main"].args[0].type == t


@settings(max_examples=40, deadline=None)
@given(padded_types(), st.integers(0, 2**31))
def test_blocks_have_the_local_shape_and_assemble_back(t: TensorType, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal(t.shape)
    blocks = scatter(x, t)
    assert all(b.shape == local_shape(t) for b in blocks)
    np.testing.assert_array_equal(assemble(blocks, t), x)
    cuts = math.prod(n for n, p in zip(t.sharding.mesh.sizes, t.sharding.placements,
                                       strict=True) if isinstance(p, Shard))
    # each element is held once per replica; every other entry of a block is padding (NaN)
    assert sum(np.isfinite(b).sum() for b in blocks) == x.size * (t.sharding.mesh.size // cuts)


def test_block_k_holds_its_rows_then_padding() -> None:
    """30 rows on 4 devices: blocks of 8, the last holds rows 24..29 and 2 rows of padding;
    nested, dp=2 cuts 7 rows in 4 + 3(+1), then tp=3 cuts each 4 in 2 + 2 + 0(+2)."""
    x = np.random.default_rng(0).standard_normal((30, 3))
    t = TensorType.of("f64", [30, 3]).with_sharding(Sharding(Mesh.of("m", tp=4),
                                                             (Shard(0, True),)))
    blocks = scatter(x, t)
    for k, b in enumerate(blocks):
        real = x[8 * k:min(8 * k + 8, 30)]
        np.testing.assert_array_equal(b[:len(real)], real)
        assert np.isnan(b[len(real):]).all() and b.shape == (8, 3)
    y = np.random.default_rng(1).standard_normal(7)
    nested = TensorType.of("f64", [7]).with_sharding(Sharding(Mesh.of("m", dp=2, tp=3),
                                                              (Shard(0, True), Shard(0, True))))
    rows = [[0, 1], [2, 3], [], [4, 5], [6], []]  # rank order: dp-major
    for b, want in zip(scatter(y, nested), rows, strict=True):
        np.testing.assert_array_equal(b[:len(want)], y[want])
        assert b.shape == (2,) and np.isnan(b[len(want):]).all()


def test_the_text_form_and_parse_placements() -> None:
    assert str(Shard(1, True)) == "S(1,pad)" and str(Shard(1)) == "S(1)"
    assert parse_placements("[S(0, pad),R]") == (Shard(0, True), Replicate())
    assert parse_placements("[S(0),S(1,pad)]") == (Shard(0), Shard(1, True))
    text = "mesh @m [tp=4]\nfunc @main(%x: f32[6,30] @m[S(1 , pad)]) -> (f32[6,30] @m[S(1,pad)])"
    module = verify(parse_module(text + " { return(%x) }"))
    assert "%x: f32[6,30] @m[S(1,pad)]" in print_module(module)
    assert local_shape(module["main"].args[0].type) == (6, 8)


@pytest.mark.parametrize(
    "arg, error, message",
    [
        ("f32[6,30] @m[R,S(1)]", VerificationError,
         r"%x of type f32\[6,30\] @m\[R,S\(1\)\]: dim 1 \(30\) does not split evenly over axis "
         r"tp=4 of mesh @m \[dp=2, tp=4\]; write S\(1,pad\) to pad each block to 8 rows"),
        ("f32[7,16] @m[S(0),R]", VerificationError, r"write S\(0,pad\) to pad each block to 4"),
        ("f32[6,30] @m[R,S(1,pads)]", ParseError, r"the only option of a shard is pad"),
        ("f32[6,30] @m[R,S(1,)]", ParseError, r"expected pad"),
    ],
)
def test_uneven_splits_need_pad(arg, error, message) -> None:
    text = f"mesh @m [dp=2, tp=4]\nfunc @main(%x: {arg}) -> ({arg}) {{ return(%x) }}"
    with pytest.raises(error, match=message):
        verify(parse_module(text))


@pytest.mark.parametrize("arg", ["f32[6,30] @m[R,S(1,pad)]", "f32[7,30] @m[S(0,pad),S(1,pad)]",
                                 "f32[8,32] @m[S(0,pad),S(1,pad)]"])
def test_padded_splits_verify_even_ones_too(arg) -> None:
    text = f"mesh @m [dp=2, tp=4]\nfunc @main(%x: {arg}) -> ({arg}) {{ return(%x) }}"
    (x,) = verify(parse_module(text))["main"].args
    want = {"f32[6,30]": (6, 8), "f32[7,30]": (4, 8), "f32[8,32]": (4, 8)}[arg.split()[0]]
    assert local_shape(x.type) == want
