"""Passes keep meaning: random graphs interpret identically before and after each pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import modules, random_array
from pass_graphs import inputs, rewrite_graphs

from tilefold.errors import TilefoldError
from tilefold.ir import Module, interpret, parse_module, print_module, verify
from tilefold.passes import run_pipeline

PIPELINES = ["default", "canonicalize", "cse", "constant-fold", "dce", "shape-inference"]


def same(a: np.ndarray, b: np.ndarray, signed_zeros: bool = False) -> bool:
    """Equal dtype, shape and values (NaN equals NaN; -0.0 equals 0.0 unless `signed_zeros`)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_:
        a, b = a.astype(np.float64), b.astype(np.float64)
        if signed_zeros and not np.array_equal(np.signbit(a), np.signbit(b)):
            return False
        return np.array_equal(a, b, equal_nan=True)
    return np.array_equal(a, b)


def optimized(module: Module, pipeline: str) -> Module:
    """A copy of `module` run through `pipeline`, checked to print back identically."""
    copy = parse_module(print_module(module))
    run_pipeline(copy, pipeline)
    text = print_module(copy)
    assert print_module(verify(parse_module(text))) == text
    return copy


def check_same_meaning(module: Module, pipeline: str, data, signed_zeros: bool = False) -> None:
    fn = module.functions["main"]
    args = data.draw(inputs([a.type for a in fn.args]))
    before = interpret(module, *args)
    after = interpret(optimized(module, pipeline), *args)
    assert len(before) == len(after)
    for i, (x, y) in enumerate(zip(before, after, strict=True)):
        assert same(x, y, signed_zeros), f"output {i} differs after {pipeline}:\n{x}\n{y}"


@pytest.mark.parametrize("pipeline", PIPELINES)
@settings(max_examples=40)
@given(module=rewrite_graphs(), data=st.data())
def test_passes_keep_meaning(pipeline: str, module: Module, data) -> None:
    check_same_meaning(module, pipeline, data)


@settings(max_examples=250)
@given(module=rewrite_graphs(max_steps=14), data=st.data())
def test_default_pipeline_keeps_meaning(module: Module, data) -> None:
    check_same_meaning(module, "default", data)


@settings(max_examples=150)
@given(module=rewrite_graphs(), data=st.data())
def test_strict_signed_zeros_keep_every_bit(module: Module, data) -> None:
    pipeline = "canonicalize{strict-signed-zeros=true},cse,constant-fold,dce"
    check_same_meaning(module, pipeline, data, signed_zeros=True)


@settings(max_examples=80)
@given(module=modules(max_ops=8), seed=st.integers(0, 2**32 - 1))
def test_default_pipeline_on_every_op(module: Module, seed: int) -> None:
    """The IR tests' random modules use every op, symbolic dims and strided types."""
    rng = np.random.default_rng(seed)
    after = optimized(module, "default")
    for name, fn in module.functions.items():
        args = [random_array(rng, a.type) for a in fn.args]
        try:
            expected = interpret(fn, *args)
        except TilefoldError:  # a run-time error (an index out of range) is not our concern
            continue
        got = interpret(after.functions[name], *args)
        for i, (x, y) in enumerate(zip(expected, got, strict=True)):
            assert same(x, y), f"@{name} output {i} differs after default:\n{x}\n{y}"
