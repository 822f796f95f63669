"""Meshes and placements in the IR: printed and parsed back exactly, and checked against shapes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefold.errors import ParseError, ShapeError, VerificationError
from tilefold.ir import Function, Module, parse_module, print_module, verify
from tilefold.ir.core import Operation, Value
from tilefold.ir.opdef import OPS
from tilefold.ir.types import (
    Mesh,
    Partial,
    Replicate,
    Shard,
    Sharding,
    TensorType,
    local_shape,
    parse_placements,
)


def identity_module(mesh: Mesh, t: TensorType) -> Module:
    """`@main(%x: t) -> (t)` returning its argument through `relu`, on `mesh`."""
    fn = Function("main", [Value(t, "x", None, 0)], [t])
    relu = Operation(OPS["relu"], [fn.args[0]], {}, [t], ["y"])
    fn.body.append(relu)
    fn.body.append(Operation(OPS["return"], [relu.result], {}, [], []))
    module = Module("placed", [fn])
    module.meshes[mesh.name] = mesh
    return module


@st.composite
def placed_types(draw) -> tuple[Mesh, TensorType]:
    """A random mesh (1 to 3 axes) and a tensor type whose placements split it evenly."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    mesh = Mesh("m", tuple((f"a{i}", n) for i, n in enumerate(sizes)))
    rank = draw(st.integers(0, 3))
    kinds = st.sampled_from(["R", "S", "Psum", "Pmax"]) if rank else st.sampled_from(["R", "P"])
    placements = []
    for _ in sizes:
        kind = draw(kinds)
        if kind == "S":
            placements.append(Shard(draw(st.integers(0, rank - 1))))
        elif kind.startswith("P"):
            placements.append(Partial("max" if kind == "Pmax" else "sum"))
        else:
            placements.append(Replicate())
    shape = []
    for d in range(rank):
        split = math.prod(n for n, p in zip(sizes, placements, strict=True) if p == Shard(d))
        shape.append(split * draw(st.integers(0, 3)))
    t = TensorType.of(draw(st.sampled_from(["f32", "bf16", "i8"])), shape)
    return mesh, t.with_sharding(Sharding(mesh, tuple(placements)))


@settings(max_examples=60, deadline=None)
@given(placed_types())
def test_random_meshes_and_placements_round_trip(case) -> None:
    mesh, t = case
    module = verify(identity_module(mesh, t))
    text = print_module(module)
    assert text.splitlines()[1] == f"  {mesh.declaration()}"
    parsed = verify(parse_module(text))
    assert print_module(parsed) == text
    assert parsed.meshes == {"m": mesh}
    assert parsed["main"].args[0].type == t


def test_the_text_form() -> None:
    text = """module @d {
  mesh @m [dp=2, tp=4]
  mesh @line [x=8]
  func @main(%x: f32[8,16]{1,8} @m[S(0),P(max)], %y: bf16[?b,4] @line[S(0)]) -> (f32[8,16]) {
    return(%x)
  }
}
"""
    # The returned %x keeps its placements, so the declared result must say them too.
    with pytest.raises(VerificationError, match=r"returns \(f32\[8,16\]\{1,8\} @m\[S\(0\),P"):
        verify(parse_module(text))
    fixed = text.replace("-> (f32[8,16])", "-> (f32[8,16]{1,8} @m[S(0), P(max)])")
    module = verify(parse_module(fixed))
    assert print_module(module) == fixed.replace("S(0), P(max)", "S(0),P(max)")
    x, y = module["main"].args
    assert x.type.sharding.placements == (Shard(0), Partial("max"))
    assert local_shape(x.type) == (4, 16) and x.type.strides == (1, 8)
    assert str(y.type) == "bf16[?b,4] @line[S(0)]"


def test_types_without_placements_print_as_before() -> None:
    t = TensorType.of("f32", [2, "b"], [1, 2])
    assert str(t) == "f32[2,?b]{1,2}" and t.sharding is None
    assert print_module(Module("plain")) == "module @plain {\n}\n"


@pytest.mark.parametrize(
    "arg, error, message",
    [
        ("f32[8,16] @n[S(0),R]", ParseError, r"unknown mesh @n \(declared: @m\)"),
        ("f32[8,16] @m[S(0)]", VerificationError,
         r"%x of type f32\[8,16\] @m\[S\(0\)\]: 1 placements for the 2 axes of "
         r"mesh @m \[dp=2, tp=4\]"),
        ("f32[8,16] @m[S(0),R,R]", VerificationError, r"3 placements for the 2 axes"),
        ("f32[8,16] @m[R,S(2)]", VerificationError,
         r"%x of type f32\[8,16\] @m\[R,S\(2\)\]: S\(2\) on axis tp is out of range for a "
         r"rank-2 tensor"),
        ("f32[7,16] @m[S(0),R]", VerificationError,
         r"%x of type f32\[7,16\] @m\[S\(0\),R\]: dim 0 \(7\) does not split evenly over axis "
         r"dp=2 of mesh @m \[dp=2, tp=4\]"),
        ("f32[8,12] @m[S(1),S(1)]", VerificationError, r"dim 1 \(6 per block\) does not split "
         r"evenly over axis tp=4"),
        ("f32[8,16] @m[P(min),R]", ParseError, r"partial reduction 'min': use sum or max"),
        ("f32[8,16] @m[Q,R]", ParseError, r"unknown placement 'Q'"),
        ("f32[8,16] @m[S(x),R]", ParseError, r"expected the sharded dim \(an integer\)"),
    ],
)
def test_bad_placements_are_errors_naming_tensor_shape_and_mesh(arg, error, message) -> None:
    text = f"mesh @m [dp=2, tp=4]\nfunc @main(%x: {arg}) -> ({arg}) {{ return(%x) }}"
    with pytest.raises(error, match=message):
        verify(parse_module(text))


@pytest.mark.parametrize(
    "decl, message",
    [
        ("mesh @m [dp=0]", r"axis dp has size 0; use an int >= 1"),
        ("mesh @m [dp=2, dp=2]", r"names an axis twice"),
        ("mesh @m [dp=2]\nmesh @m [tp=2]", r"redefinition of mesh @m"),
        ("mesh @m [dp]", r"expected '=' after a mesh axis name"),
    ],
)
def test_bad_mesh_declarations(decl, message) -> None:
    with pytest.raises(ParseError, match=message):
        parse_module(f"{decl}\nfunc @main(%x: f32[4]) -> (f32[4]) {{ return(%x) }}")


def test_a_mesh_after_the_functions_is_an_error_that_says_where_it_goes() -> None:
    text = "func @main(%x: f32[4]) -> (f32[4]) { return(%x) }\nmesh @m [dp=2]"
    with pytest.raises(ParseError, match=r"meshes are declared before the functions"):
        parse_module(text)


def test_a_built_module_must_declare_its_meshes() -> None:
    mesh = Mesh.of("m", dp=2)
    t = TensorType.of("f32", [4]).with_sharding(Sharding(mesh, (Shard(0),)))
    module = identity_module(mesh, t)
    module.meshes.clear()
    with pytest.raises(VerificationError, match=r"placed on 'mesh @m \[dp=2\]', which this "
                       r"module has not declared"):
        verify(module)
    module.meshes["m"] = Mesh.of("m", dp=4)
    with pytest.raises(VerificationError, match=r"declared as 'mesh @m \[dp=4\]'"):
        verify(module)


def test_ordinary_ops_leave_placements_to_the_declared_type() -> None:
    """An op that does not reason about placements (relu) keeps what the text says."""
    mesh = Mesh.of("m", dp=2)
    t = TensorType.of("f32", [4, 2])
    module = identity_module(mesh, t.with_sharding(Sharding(mesh, (Shard(0),))))
    relu = module["main"].ops[0]
    relu.results[0].type = module["main"].result_types[0] = t.with_sharding(
        Sharding(mesh, (Partial(),)))
    verify(module)  # the sharding rules, not the verifier, judge an ordinary op's placements
    relu.results[0].type = module["main"].result_types[0] = TensorType.of("f32", [4, 3])
    with pytest.raises(VerificationError, match=r"does not match the inferred f32\[4,2\]"):
        verify(module)


def test_placement_text_helpers() -> None:
    assert parse_placements("[S(1), R,P(max)]") == (Shard(1), Replicate(), Partial("max"))
    assert parse_placements("[]") == ()
    for bad in ("S(1),R", "[S(-1)]", "[T]"):
        with pytest.raises(ShapeError):
            parse_placements(bad)
    with pytest.raises(ShapeError, match="partial reduction 'min'"):
        Partial("min")


def test_modules_differing_only_in_a_mesh_are_not_equal():
    from tilefold.ir import first_difference, parse_module

    body = "func @main(%x: f32[4]) -> (f32[4]) {\n  return(%x)\n}\n"
    two, four = (parse_module(f"mesh @m [tp={n}]\n" + body) for n in (2, 4))
    assert "meshes differ" in first_difference(two, four)
    assert first_difference(two, parse_module("mesh @m [tp=2]\n" + body)) is None
