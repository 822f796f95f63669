"""The IR data structures as passes use them: uses, replacement, removal, walking, comparison."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.ir import (
    Builder,
    first_difference,
    parse_module,
    print_module,
    print_op,
    structurally_equal,
    verify,
)
from tilefold.ir import functional as F

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
