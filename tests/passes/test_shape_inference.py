"""shape-inference: binding symbolic dims specializes whole functions, regions included."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tilefold.errors import PassError
from tilefold.ir import interpret, parse_module, print_module
from tilefold.passes import PassManager, ShapeInference, run_pipeline

TEXT = """func @f(%x: f32[?b,6], %y: f32[?s]) -> (f32[?b,2,3], f32[?s]) {
  %0 = reshape(%x) {shape = [?b, 2, 3]} : f32[?b,2,3]
  %1 = fused(%0) : f32[?b,2,3] region (%r: f32[?b,2,3]) {
    %2 = exp(%r) : f32[?b,2,3]
    yield(%2)
  }
  return(%1, %y)
}"""


def test_bind_specializes_arguments_attributes_regions_and_results() -> None:
    m = parse_module(TEXT)
    p = ShapeInference(bind={"b": 4})
    PassManager([p]).run(m)
    text = print_module(m)
    assert "?b" not in text
    assert "func @f(%x: f32[4,6], %y: f32[?s]) -> (f32[4,2,3], f32[?s])" in text
    assert "reshape(%x) {shape = [4, 2, 3]}" in text
    assert "region (%r: f32[4,2,3])" in text
    assert p.stats == {"num-bound": 2, "num-refined": 3}  # %x and %r; %0, %2 and %1


def test_specialized_function_computes_the_same() -> None:
    m = parse_module(TEXT)
    x, y = np.arange(24, dtype=np.float32).reshape(4, 6) / 10, np.ones(5, np.float32)
    expected = interpret(m, x, y)
    run_pipeline(m, "shape-inference{bind=b=4,s=5}")
    for a, b in zip(expected, interpret(m, x, y), strict=True):
        assert np.array_equal(a, b)


def test_no_binding_changes_nothing() -> None:
    m = parse_module(TEXT)
    p = ShapeInference()
    PassManager([p]).run(m)
    assert print_module(m) == print_module(parse_module(TEXT))
    assert p.stats == {"num-bound": 0, "num-refined": 0}


def test_an_unused_name_warns(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tilefold.passes"):
        run_pipeline(parse_module(TEXT), "shape-inference{bind=batch=4}")
    assert "bind names ?batch, which the module does not use (its symbolic dims: ?b, ?s)" in (
        caplog.text
    )


def test_a_binding_the_ops_reject_is_an_error_at_the_op() -> None:
    m = parse_module(
        "func @f(%x: f32[?b]) -> (f32[]) {\n  %0 = reduce_max(%x) : f32[]\n  return(%0)\n}",
        "model.tfir",
    )
    with pytest.raises(PassError) as info:
        run_pipeline(m, "shape-inference{bind=b=0}")
    assert "cannot reduce the empty axis" in info.value.message
    assert str(info.value).startswith("model.tfir:2:8: error: shape-inference: reduce_max:")
