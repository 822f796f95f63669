"""Elementwise ops (unary, binary, comparisons, where, cast) against NumPy and closed forms."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ir_oracle import assert_close, round_once, run_op

from tilefold import dtypes
from tilefold.errors import DTypeError

FLOATS = [dtypes.f64, dtypes.f32, dtypes.f16, dtypes.bf16]
# Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7: an erf independent of the one the oracle uses.
_P, _A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf_as(x: np.ndarray) -> np.ndarray:
    t = 1 / (1 + _P * np.abs(x))
    poly = sum(a * t ** (i + 1) for i, a in enumerate(_A))
    return np.sign(x) * (1 - poly * np.exp(-x * x))


def sample(rng: np.random.Generator, dt: dtypes.DType, shape=(3, 5), scale=3.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dt.np_dtype)


UNARY = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x,
    "tanh": np.tanh,
    "erf": np.vectorize(math.erf),
    "sigmoid": lambda x: 0.5 * (1 + np.tanh(x / 2)),
    "silu": lambda x: x * 0.5 * (1 + np.tanh(x / 2)),
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "neg": lambda x: -x,
    "abs": np.abs,
    "sin": np.sin,
    "cos": np.cos,
    "floor": np.floor,
    "gelu": lambda x: x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "softplus": lambda x: np.where(x > 20, x, np.log1p(np.exp(x))),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dt", FLOATS, ids=str)
@given(seed=st.integers(0, 2**32 - 1))
def test_unary_ops_match_closed_forms(name, dt, seed) -> None:
    x = sample(np.random.default_rng(seed), dt)
    x.flat[:3] = np.array([0.0, -0.0, 1.0]).astype(dt.np_dtype)  # exact special points too
    expected = UNARY[name](x.astype(np.float64))
    with np.errstate(all="ignore"):
        assert_close(run_op(name, x), expected, scale=max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("name", ["gelu", "silu", "exp", "erf", "sigmoid"])
@pytest.mark.parametrize("dt", [dtypes.bf16, dtypes.f16, dtypes.fp8e4m3], ids=str)
def test_low_precision_is_computed_in_f64_and_rounded_once(name, dt) -> None:
    x = np.linspace(-4, 4, 101).astype(dt.np_dtype)
    expected = round_once(UNARY[name](x.astype(np.float64)), dt)
    assert run_op(name, x).tobytes() == expected.tobytes()


def test_erf_known_values_symmetry_and_independent_form() -> None:
    x = np.array([0.0, 0.5, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan])
    known = [0.0, 0.5204998778130465, 0.8427007929497149, 0.9953222650189527, -0.8427007929497149]
    got = run_op("erf", x)
    np.testing.assert_allclose(got[:5], known, rtol=1e-15)
    assert got[5] == 1 and got[6] == -1 and np.isnan(got[7])
    y = np.random.default_rng(1).standard_normal(200)
    np.testing.assert_allclose(run_op("erf", y), erf_as(y), atol=2e-7)
    np.testing.assert_array_equal(run_op("erf", -y), -run_op("erf", y))


def test_gelu_erf_and_tanh_forms() -> None:
    x = np.random.default_rng(2).standard_normal(1000) * 3
    exact = run_op("gelu", x)
    tanh = run_op("gelu", x, approximate="tanh")
    closed = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert_close(tanh, closed, scale=10)
    np.testing.assert_allclose(exact, x * 0.5 * (1 + erf_as(x / math.sqrt(2))), atol=1e-6)
    # the approximation is close to, but not, the erf form (max gap about 4.7e-4)
    gap = np.abs(exact - tanh).max()
    assert 1e-5 < gap < 1e-3
    for v, want in [(0.0, 0.0), (1.0, 0.8413447460685429), (-1.0, -0.15865525393145707)]:
        assert run_op("gelu", np.array(v)) == pytest.approx(want, rel=1e-15, abs=1e-300)


def test_special_values() -> None:
    x = np.array([np.nan, np.inf, -np.inf, -1.0, 0.0, -0.0])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run_op("relu", x)[:3], [np.nan, np.inf, 0.0])
        np.testing.assert_array_equal(run_op("log", x[3:]), [np.nan, -np.inf, -np.inf])
        np.testing.assert_array_equal(run_op("rsqrt", x[4:]), [np.inf, -np.inf])
        np.testing.assert_array_equal(run_op("sigmoid", x[1:3]), [1.0, 0.0])
        np.testing.assert_array_equal(run_op("exp", np.array([1000.0], np.float32)), [np.inf])
    assert np.signbit(run_op("neg", np.array([0.0])))[0]


def test_integer_unary_ops_wrap() -> None:
    x = np.array([-128, -3, 0, 5, 127], np.int8)
    np.testing.assert_array_equal(run_op("neg", x), [-128, 3, 0, -5, -127])
    np.testing.assert_array_equal(run_op("abs", x), [-128, 3, 0, 5, 127])
    np.testing.assert_array_equal(run_op("relu", x), [0, 0, 0, 5, 127])
    np.testing.assert_array_equal(run_op("neg", np.array([1, 0], np.uint8)), [255, 0])


BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
}
BROADCASTS = [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((), (5,)), ((4, 1), (1, 4)), ((0, 3), (3,))]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_binary_float_ops_broadcast_like_numpy(name, dt, shapes) -> None:
    rng = np.random.default_rng(len(name))
    x, y = (sample(rng, dt, s, scale=2.0) for s in shapes)
    if name == "pow":
        x = np.abs(x)
    with np.errstate(all="ignore"):
        expected = BINARY[name](x.astype(np.float64), y.astype(np.float64))
    assert_close(
        run_op(name, x, y), expected, scale=max(1.0, float(np.abs(expected).max(initial=0)))
    )


def test_max_min_propagate_nan() -> None:
    x, y = np.array([np.nan, 1.0, 2.0]), np.array([0.0, np.nan, 1.0])
    np.testing.assert_array_equal(run_op("max", x, y), [np.nan, np.nan, 2.0])
    np.testing.assert_array_equal(run_op("min", x, y), [np.nan, np.nan, 1.0])


@given(
    st.lists(st.integers(-128, 127), min_size=1, max_size=20),
    st.lists(st.integers(-128, 127), min_size=1, max_size=20),
)
def test_integer_division_truncates_toward_zero(xs, ys) -> None:
    n = min(len(xs), len(ys))
    x, y = np.array(xs[:n], np.int8), np.array(ys[:n], np.int8)
    expected = [
        0 if b == 0 else int(abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)
        for a, b in zip(xs, ys, strict=False)
    ]
    np.testing.assert_array_equal(run_op("div", x, y), np.array(expected[:n]).astype(np.int8))


def test_integer_arithmetic_wraps_and_negative_powers_truncate() -> None:
    x = np.array([100, -100, 2, -1, 1, 0, 3], np.int8)
    y = np.array([100, -100, -1, -3, -5, -2, 4], np.int8)
    np.testing.assert_array_equal(
        run_op("add", x, y), np.array([200, -200, 1, -4, -4, -2, 7]).astype(np.int8)
    )
    np.testing.assert_array_equal(
        run_op("mul", x, y), np.array([10000, 10000, -2, 3, -5, 0, 12]).astype(np.int8)
    )
    np.testing.assert_array_equal(run_op("pow", x[2:], y[2:]), [0, -1, 1, 0, 81])
    np.testing.assert_array_equal(
        run_op("sub", np.array([0], np.uint8), np.array([1], np.uint8)), [255]
    )


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge"])
@pytest.mark.parametrize(
    "dt", [dtypes.f32, dtypes.bf16, dtypes.i32, dtypes.u8, dtypes.boolean], ids=str
)
def test_comparisons(name, dt) -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, (4, 5)).astype(dt.np_dtype)
    y = rng.integers(0, 3, (5,)).astype(dt.np_dtype)
    if dt.is_float:
        x[0, :2] = np.nan
    ufunc = {
        "eq": np.equal,
        "ne": np.not_equal,
        "lt": np.less,
        "le": np.less_equal,
        "gt": np.greater,
        "ge": np.greater_equal,
    }[name]
    got = run_op(name, x, y)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ufunc(x.astype(np.float64), y.astype(np.float64)))


def test_logical_ops() -> None:
    x = np.array([[True, False], [True, True]])
    y = np.array([False, True])
    np.testing.assert_array_equal(run_op("and", x, y), x & y)
    np.testing.assert_array_equal(run_op("or", x, y), x | y)


def test_where_broadcasts_all_three() -> None:
    rng = np.random.default_rng(4)
    cond = rng.random((4, 1)) < 0.5
    x = rng.standard_normal((1, 5)).astype(np.float32)
    y = np.array(-7.5, np.float32)
    got = run_op("where", cond, x, y)
    np.testing.assert_array_equal(got, np.where(cond, x, y))
    assert got.shape == (4, 5)
    with pytest.raises(DTypeError, match="condition must be bool"):
        run_op("where", x, x, x)


def test_cast_float_to_int_truncates_and_saturates() -> None:
    x = np.array([1.7, -1.7, 300.0, -300.0, np.nan, np.inf, -np.inf, -0.5], np.float32)
    np.testing.assert_array_equal(
        run_op("cast", x, dtype="i8"), [1, -1, 127, -128, 0, 127, -128, 0]
    )
    np.testing.assert_array_equal(run_op("cast", x, dtype="u8"), [1, 0, 255, 0, 0, 255, 0, 0])
    np.testing.assert_array_equal(run_op("cast", x, dtype="i4"), [1, -1, 7, -8, 0, 7, -8, 0])
    big = np.array([1e30, -1e30, 2.0**62], np.float64)
    np.testing.assert_array_equal(run_op("cast", big, dtype="i64"), [2**63 - 1, -(2**63), 2**62])


def test_cast_between_floats_rounds_to_nearest_even_once() -> None:
    x = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, 1e39, -1e-50], np.float64)
    got = run_op("cast", x, dtype="bf16").astype(np.float64)
    np.testing.assert_array_equal(got[:4], [1 + 2**-7, 1.0, 1 + 2**-6, np.inf])
    assert got[4] == 0 and np.signbit(got[4])
    halves = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65520.0], np.float64)
    np.testing.assert_array_equal(run_op("cast", halves, dtype="f16"), [1.0, 1 + 2**-9, np.inf])
    rng = np.random.default_rng(5)
    y = rng.standard_normal(500) * 10.0 ** rng.integers(-5, 5, 500)
    for dt in (dtypes.bf16, dtypes.fp8e4m3):
        assert run_op("cast", y, dtype=dt).tobytes() == round_once(y, dt).tobytes()


def test_cast_to_small_floats_follows_ml_dtypes_range_rules() -> None:
    x = np.array([500.0, -1000.0, 7.0, 100.0], np.float32)
    fp8 = run_op("cast", x[:2], dtype="fp8e4m3").astype(np.float64)
    assert np.isnan(fp8).all()  # e4m3fn has no inf: out of range is NaN
    fp4 = run_op("cast", x[2:], dtype="fp4e2m1").astype(np.float64)
    np.testing.assert_array_equal(fp4, [6.0, 6.0])  # e2m1 saturates at 6


def test_cast_integers_wrap_and_bools() -> None:
    np.testing.assert_array_equal(
        run_op("cast", np.array([300, -129], np.int32), dtype="i8"), [44, 127]
    )
    x = np.array([0.0, -0.0, np.nan, 2.5], np.float32)
    np.testing.assert_array_equal(run_op("cast", x, dtype="bool"), [False, False, True, True])
    np.testing.assert_array_equal(run_op("cast", np.array([True, False]), dtype="f32"), [1.0, 0.0])
    big = np.array([2**53 + 1, -(2**60) - 1], np.int64)
    assert_close(run_op("cast", big, dtype="f32"), big.astype(np.float64))
    i4 = run_op("cast", np.array([7, -8, 3], np.int8), dtype="i4")
    assert i4.dtype == ml_dtypes.int4 and i4.astype(int).tolist() == [7, -8, 3]
