"""The IR data structures as passes use them: uses, replacement, removal, walking, comparison."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefold.errors import VerificationError
from tilefold.ir import (
    OPS,
    Attr,
    Builder,
    OpDef,
    first_difference,
    interpret,
    parse_file,
    parse_module,
    print_module,
    print_op,
    register,
    structurally_equal,
    trace,
    verify,
)
from tilefold.ir import functional as F
from tilefold.ir.opdef import attr_table
from tilefold.ir.types import dim

TEXT = """\
module @m {
  func @main(%x: f32[?b,4], %w: f32[4,4]) -> (f32[?b,4], f32[?b,4]) {
    %0 = matmul(%x, %w) : f32[?b,4]
    %1 = gelu(%0) {approximate = "tanh"} : f32[?b,4] loc("m.py":3:8)
    %2 = exp(%0) : f32[?b,4]
    %3 = add(%1, %2) : f32[?b,4]
    return(%3, %1)
  }
}
"""


def test_printed_form_is_stable_and_readable() -> None:
    module = parse_module(TEXT)
    assert print_module(module) == TEXT
    assert str(module) == TEXT
    assert print_op(module["main"].ops[1]) == (
        '%1 = gelu(%0) {approximate = "tanh"} : f32[?b,4] loc("m.py":3:8)'
    )


def test_uses_replace_all_uses_and_erase() -> None:
    module = parse_module(TEXT)
    fn = module["main"]
    matmul, gelu, exp, add, ret = fn.ops
    uses = fn.uses()
    assert uses[matmul.result] == [gelu, exp]
    assert uses[gelu.result] == [add, ret]
    fn.replace_all_uses(exp.result, gelu.result)
    assert add.operands == [gelu.result, gelu.result]
    exp.erase()
    assert exp.parent is None and fn.ops == [matmul, gelu, add, ret]
    verify(module)
    assert "exp" not in print_module(module)
    fn.body.remove(add)
    with pytest.raises(ValueError):
        fn.body.remove(add)


def test_insert_fresh_names_and_walk() -> None:
    b = Builder()
    x = b.arg("x", "f32", (4,))
    y = F.exp(x)
    module = b.build(y)
    fn = module["main"]
    assert fn.fresh_name() == "1" and fn.fresh_name("x") == "x0" and fn.fresh_name("t") == "t"
    b2 = Builder("tmp")
    op = b2.op("neg", b2.arg(fn.fresh_name("x"), "f32", (4,))).value.defining_op
    op.operands = [y.value]
    op.results[0].name = fn.fresh_name()
    fn.body.insert(1, op)
    fn.return_op.operands = [op.result]
    verify(module)
    assert [o.name for o in fn.walk()] == ["exp", "neg", "return"]
    assert [o.name for o in module.walk()] == ["exp", "neg", "return"]
    assert fn.outputs == [op.result]


def test_operation_accessors() -> None:
    fn = parse_module(TEXT)["main"]
    gelu, add, ret = fn.ops[1], fn.ops[3], fn.ops[4]
    assert gelu.attr("approximate") == "tanh"
    assert fn.ops[2].opdef.attributes == {} and add.has_trait("commutative")
    assert ret.has_trait("terminator") and not add.has_trait("terminator")
    assert fn.ops[0].attr("transpose_a") is False  # the declared default
    with pytest.raises(AssertionError):
        _ = ret.result


def test_structural_equality_ignores_names_unless_asked() -> None:
    a = parse_module(TEXT)
    b = parse_module(TEXT.replace("%1", "%g").replace("%0", "%mm"))
    assert structurally_equal(a, b)
    assert not structurally_equal(a, b, names=True)
    assert "value names differ" in first_difference(a, b, names=True)
    changes = {
        '"tanh"': ('"none"', "attribute 'approximate' differs"),
        "exp(%0)": ("neg(%0)", "'exp' vs 'neg'"),
        "add(%1, %2)": ("add(%2, %1)", "operands differ"),
        "return(%3, %1)": ("return(%3, %3)", "operands differ"),
    }
    for old, (new, why) in changes.items():
        assert why in first_difference(a, parse_module(TEXT.replace(old, new)))
    assert "locations differ" in first_difference(
        a, parse_module(TEXT.replace(' loc("m.py":3:8)', "")), names=True
    )
    assert first_difference(a["main"], a) == "cannot compare Function with Module"


def test_structural_equality_compares_constants_bit_for_bit() -> None:
    def module_of(value):
        b = Builder()
        return b.build(b.constant(np.array(value, np.float32)))

    assert structurally_equal(module_of([np.nan, 1.0]), module_of([np.nan, 1.0]))
    assert not structurally_equal(module_of([0.0]), module_of([-0.0]))
    assert not structurally_equal(module_of([1.0]), module_of([1.0, 1.0]))


REGION = """\
module {
  func @main(%x: f32[?b,8], %w: f32[8,16]) -> (f32[?b,16]) {
    %0 = fused(%x, %w) {kind = "compute"} : f32[?b,16] region (%a: f32[?b,8], %c: f32[8,16]) {
      %1 = matmul(%a, %c) : f32[?b,16]
      %2 = reshape(%1) {shape = [?b, 4, 4]} : f32[?b,4,4]
      %3 = reshape(%2) {shape = [?b, 16]} : f32[?b,16]
      %4 = gelu(%3) : f32[?b,16]
      yield(%4)
    } loc("m.py":2:3)
    return(%0)
  }
}
"""


def test_ops_with_regions_print_parse_verify_and_run() -> None:
    module = verify(parse_module(REGION))
    assert print_module(module) == REGION
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    direct = trace(lambda a, c: F.gelu(a @ c), ("x", "f32", ("b", 8)), ("w", "f32", (8, 16)))
    np.testing.assert_array_equal(interpret(module, x, w)[0], interpret(direct, x, w)[0])
    assert [op.name for op in module.walk()] == [
        "fused",
        "matmul",
        "reshape",
        "reshape",
        "gelu",
        "yield",
        "return",
    ]
    assert {v.name for v in module["main"].values()} >= {"a", "c", "4"}


def test_regions_see_only_their_arguments_and_end_with_yield() -> None:
    outer = REGION.replace("matmul(%a, %c)", "matmul(%x, %c)")
    with pytest.raises(VerificationError, match="from outside its region"):
        verify(parse_module(outer))
    with pytest.raises(VerificationError, match="block must end with 'yield'"):
        verify(parse_module(REGION.replace("      yield(%4)\n", "")))


def test_interpret_takes_a_function_or_the_only_one_of_a_module(tmp_path) -> None:
    path = tmp_path / "m.tfir"
    path.write_text(TEXT.replace("@main", "@only"))
    module = parse_file(path)
    assert module.source_name == str(path)
    x = np.ones((2, 4), np.float32)
    w = np.eye(4, dtype=np.float32)
    by_module = interpret(module, x, w)
    by_function = interpret(module["only"], x, w)
    assert [a.tobytes() for a in by_module] == [a.tobytes() for a in by_function]


def test_names_of_modules_and_functions_are_checked() -> None:
    module = parse_module(TEXT)
    module.name = "bad name"
    with pytest.raises(VerificationError, match="module name @bad name"):
        verify(module)
    module = parse_module(TEXT)
    module["main"].name = "other"
    with pytest.raises(VerificationError, match="function name @other"):
        verify(module)
    b = Builder("main")
    with pytest.raises(VerificationError, match="already has a function @main"):
        Builder("main", b.module)


class _Split(OpDef):
    """Test-only op: two results and a free-text attribute. `%a, %b = test_split(%x)`"""

    name = "test_split"
    operands = ("x",)
    attributes = attr_table(note=Attr("str", ""), shape=Attr("shape", ()))

    @classmethod
    def infer(cls, types, attrs):
        return [types[0], types[0].with_dtype("i32")]

    @classmethod
    def reference(cls, args, attrs):
        return [args[0], args[0].astype(np.int32)]


@pytest.fixture(scope="module")
def split_op():
    register(_Split)
    yield _Split
    del OPS[_Split.name]


@settings(max_examples=50)
@given(note=st.text(), shape=st.lists(st.integers(0, 2**70) | st.sampled_from(["b", "n"])))
def test_several_results_and_any_string_attribute_round_trip(split_op, note, shape) -> None:
    b = Builder()
    x = b.arg("x", "f32", ("b", "n"))
    first, second = b.op("test_split", x, note=note, shape=shape)
    module = b.build(second, first)
    text = print_module(module)
    assert "%0, %1 = test_split(%x)" in text and ": (f32[?b,?n], i32[?b,?n])" in text
    parsed = verify(parse_module(text))
    assert print_module(parsed) == text
    op = parsed["main"].ops[0]
    assert op.attr("note") == note and op.attr("shape") == tuple(dim(d) for d in shape)
    got = interpret(parsed, np.array([[1.5, -2.5]], np.float32))
    assert got[0].tolist() == [[1, -2]] and got[1].tolist() == [[1.5, -2.5]]
