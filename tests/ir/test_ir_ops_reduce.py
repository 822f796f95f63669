"""Reductions, the softmax family, the norms and cumsum against NumPy and their defining
properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ir_oracle import assert_close, round_once, run_op

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir import Builder, interpret

REDUCTIONS = {
    "reduce_sum": np.sum,
    "reduce_max": np.max,
    "reduce_min": np.min,
    "reduce_mean": np.mean,
}


@st.composite
def shapes_and_axes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), max_size=4)))
    rank = len(shape)
    axes = draw(
        st.none() | st.lists(st.integers(-rank, rank - 1), unique_by=lambda a: a % rank)
        if rank
        else st.none() | st.just([])
    )
    return shape, axes, draw(st.booleans())


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("dt", [dtypes.f64, dtypes.f32, dtypes.bf16, dtypes.i32], ids=str)
@given(case=shapes_and_axes(), seed=st.integers(0, 2**32 - 1))
def test_reductions_match_numpy(name, dt, case, seed) -> None:
    shape, axes, keepdims = case
    if name == "reduce_mean" and not dt.is_float:
        return
    x = (np.random.default_rng(seed).standard_normal(shape) * 4).astype(dt.np_dtype)
    axis = None if axes is None else tuple(axes)
    expected = REDUCTIONS[name](x.astype(np.float64), axis=axis, keepdims=keepdims)
    attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
    got = run_op(name, x, **attrs)
    assert got.shape == np.shape(expected)
    assert_close(got, expected, scale=float(np.abs(x.astype(np.float64)).sum()) + 1)


def test_empty_axes_list_reduces_nothing_and_empty_dims_reduce_to_identity() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3))
    np.testing.assert_array_equal(run_op("reduce_sum", x, axes=[]), x)
    empty = np.zeros((0, 3))
    np.testing.assert_array_equal(run_op("reduce_sum", empty, axes=[0]), [0.0, 0.0, 0.0])
    assert np.isnan(run_op("reduce_mean", empty, axes=[0])).all()
    with pytest.raises(ShapeError, match="empty axis"):
        run_op("reduce_max", empty, axes=[0])


def test_max_of_a_symbolic_axis_that_is_empty_at_run_time_is_a_shape_error() -> None:
    b = Builder()
    x = b.arg("x", "f32", ("n", 3))
    module = b.build(b.op("reduce_max", x, axes=[0]))
    with pytest.raises(ShapeError, match="empty axis"):
        interpret(module, np.zeros((0, 3), np.float32))


def test_integer_sums_wrap_and_nan_propagates() -> None:
    np.testing.assert_array_equal(run_op("reduce_sum", np.full(3, 100, np.int8)), np.int8(44))
    x = np.array([[1.0, np.nan], [2.0, 3.0]])
    np.testing.assert_array_equal(run_op("reduce_max", x, axes=[1]), [np.nan, 3.0])
    np.testing.assert_array_equal(run_op("reduce_min", x, axes=[0]), [1.0, np.nan])
    with pytest.raises(DTypeError):
        run_op("reduce_mean", np.array([1, 2], np.int32))
    with pytest.raises(DTypeError):
        run_op("reduce_sum", np.array([True, False]))


@pytest.mark.parametrize("dt", [dtypes.f64, dtypes.f32, dtypes.bf16, dtypes.i32], ids=str)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_cumsum_is_the_running_sum_rounded_once(dt, axis) -> None:
    x = (np.random.default_rng(6).standard_normal((3, 4, 5)) * 40).astype(dt.np_dtype)
    wide = x.astype(np.float64)
    got = run_op("cumsum", x, axis=axis)
    assert_close(got, np.cumsum(wide, axis=axis), scale=float(np.abs(wide).sum()) + 1)
    last = np.take(got, [-1], axis=axis).squeeze(axis)
    assert_close(last, wide.sum(axis=axis), scale=float(np.abs(wide).sum()) + 1)


def test_cumsum_wraps_integers_keeps_empty_axes_and_rejects_bools() -> None:
    np.testing.assert_array_equal(run_op("cumsum", np.full(3, 100, np.int8), axis=0),
                                  np.array([100, -56, 44], np.int8))
    assert run_op("cumsum", np.zeros((2, 0), np.float32), axis=1).shape == (2, 0)
    with pytest.raises(DTypeError, match="cumsum"):
        run_op("cumsum", np.array([True, False]), axis=0)
    with pytest.raises(ShapeError, match="cumsum: axis 2"):
        run_op("cumsum", np.zeros((2, 3)), axis=2)


@pytest.mark.parametrize("dt", [dtypes.f64, dtypes.f32, dtypes.f16, dtypes.bf16], ids=str)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_rows_sum_to_one_and_equal_exp_over_sum(dt, axis) -> None:
    x = (np.random.default_rng(1).standard_normal((4, 6)) * 3).astype(dt.np_dtype)
    wide = x.astype(np.float64)
    expected = np.exp(wide) / np.exp(wide).sum(axis=axis, keepdims=True)
    got = run_op("softmax", x, axis=axis)
    assert_close(got, expected)
    sums = got.astype(np.float64).sum(axis=axis)
    np.testing.assert_allclose(
        sums, 1.0, atol=float(np.finfo(np.float16).eps) * 6 if dt.bits == 16 else 1e-6
    )
    assert got.tobytes() == round_once(expected, dt).tobytes() or dt.bits > 16


def test_softmax_is_shift_invariant_and_handles_large_and_infinite_inputs() -> None:
    x = np.random.default_rng(2).standard_normal((3, 5))
    np.testing.assert_allclose(run_op("softmax", x + 1000.0), run_op("softmax", x), rtol=1e-12)
    got = run_op("softmax", np.array([[0.0, -np.inf, 1000.0], [1.0, 1.0, 1.0]]))
    np.testing.assert_allclose(got, [[0.0, 0.0, 1.0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-15)


@pytest.mark.parametrize("dt", [dtypes.f64, dtypes.f32, dtypes.bf16], ids=str)
def test_log_softmax_is_log_of_softmax_without_underflow(dt) -> None:
    x = (np.random.default_rng(3).standard_normal((4, 7)) * 3).astype(dt.np_dtype)
    wide = x.astype(np.float64)
    assert_close(
        run_op("log_softmax", x, axis=0), np.log(run_op("softmax", wide, axis=0)), scale=30
    )
    gap = run_op("log_softmax", np.array([0.0, -1000.0]))
    np.testing.assert_allclose(gap, [0.0, -1000.0], atol=1e-12)  # log(softmax) would give -inf


@pytest.mark.parametrize("dt", [dtypes.f64, dtypes.f32, dtypes.bf16], ids=str)
@pytest.mark.parametrize("axis", [-1, -2])
def test_layer_norm_standardizes_then_applies_the_affine(dt, axis) -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 4, 8)) * 5 + 2).astype(dt.np_dtype)
    norm_shape = x.shape[axis:]
    ones, zeros = np.ones(norm_shape, dt.np_dtype), np.zeros(norm_shape, dt.np_dtype)
    plain = run_op("layer_norm", x, ones, zeros, axis=axis, eps=0.0).astype(np.float64)
    axes = tuple(range(x.ndim + axis, x.ndim))
    tol = 1e-12 if dt == dtypes.f64 else 1e-5 if dt == dtypes.f32 else 2e-2
    np.testing.assert_allclose(plain.mean(axis=axes), 0.0, atol=tol)
    np.testing.assert_allclose(plain.var(axis=axes), 1.0, atol=tol * 10)
    w = rng.standard_normal(norm_shape).astype(dt.np_dtype)
    b = rng.standard_normal(norm_shape).astype(dt.np_dtype)
    wide = [a.astype(np.float64) for a in (x, w, b)]
    mean = wide[0].mean(axis=axes, keepdims=True)
    var = wide[0].var(axis=axes, keepdims=True)
    expected = (wide[0] - mean) / np.sqrt(var + 1e-5) * wide[1] + wide[2]
    assert_close(run_op("layer_norm", x, w, b, axis=axis), expected, scale=10)


@pytest.mark.parametrize("dt", [dtypes.f64, dtypes.f32, dtypes.f16], ids=str)
def test_rms_norm(dt) -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((5, 16)) * 3).astype(dt.np_dtype)
    w = rng.standard_normal(16).astype(dt.np_dtype)
    wide = x.astype(np.float64)
    expected = wide / np.sqrt((wide**2).mean(axis=-1, keepdims=True) + 1e-6) * w.astype(np.float64)
    assert_close(run_op("rms_norm", x, w, eps=1e-6), expected, scale=10)
    unit = run_op("rms_norm", x, np.ones(16, dt.np_dtype), eps=0.0).astype(np.float64)
    np.testing.assert_allclose((unit**2).mean(axis=-1), 1.0, rtol=1e-2 if dt.bits == 16 else 1e-6)


def test_norms_reject_mismatched_affine_shapes_and_integers() -> None:
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ShapeError, match="normalized dims"):
        run_op("layer_norm", x, np.ones(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(DTypeError):
        run_op("rms_norm", np.zeros((2, 4), np.int32), np.ones(4, np.int32))
