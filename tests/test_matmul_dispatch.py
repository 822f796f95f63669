"""`tilefold.matmul` routes low-precision operands to the quant kernels, with NumPy semantics."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tilefold as tf
from tests.tolerances import assert_close
from tilefold.quant.accuracy import matmul_bound
from tilefold.quant.api import widened_source
from tilefold.target import host_target

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("shape", [(1, 32, 7), (37, 96, 50), (2, 5, 64, 33)])
def test_half_precision_pairs_accumulate_in_f32(dtype, shape):
    *lead, m, k, n = (1, *shape) if len(shape) == 3 else shape
    a = RNG.standard_normal((*lead, m, k)).astype(dtype)
    b = RNG.standard_normal((k, n)).astype(dtype)
    c = tf.matmul(a, b)
    assert c.dtype == np.float32 and c.shape == (*lead, m, n)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert (np.abs(c - ref) <= matmul_bound(a, b)).all()


@pytest.mark.parametrize("a_dtype,low", [(np.uint8, 0), (np.int8, -128)])
def test_int8_pairs_are_exact_int32(a_dtype, low):
    a = RNG.integers(low, low + 256, (33, 70)).astype(a_dtype)
    b = RNG.integers(-128, 128, (70, 19)).astype(np.int8)
    out = np.full((33, 19), -1, np.int32)
    c = tf.matmul(a, b, out=out)
    assert c is out
    np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("fmt", ["int4", "fp8", "int8"])
def test_quantized_weight_matches_the_dequantized_math(fmt):
    w = RNG.standard_normal((128, 48)).astype(np.float32)
    qw = tf.quantize(w, fmt, group_size=32, axis=0)
    x = RNG.standard_normal((5, 128)).astype(np.float32)
    dq = tf.dequantize(qw)
    y = tf.matmul(x, qw)
    assert y.dtype == np.float32 and y.shape == (5, 48)
    assert (np.abs(y - x.astype(np.float64) @ dq.astype(np.float64)) <= matmul_bound(x, dq)).all()


def test_bad_low_precision_calls_raise_tilefold_errors():
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    torch_style = tf.quantize(RNG.standard_normal((8, 64)).astype(np.float32), "int4",
                              group_size=32, axis=1)
    with pytest.raises(tf.ShapeError, match="axis 0"):
        tf.matmul(x, torch_style)
    a = RNG.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    # DTypeError where the f32 GEMM runs bf16 (widened), ShapeError from the bf16 kernels
    with pytest.raises((tf.ShapeError, tf.DTypeError), match="out must be"):
        tf.matmul(a, a.T.copy(), out=np.empty((4, 4), ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 17, 40), (3, 40, 9)), ((40,), (40, 13)),
                                                  ((5, 40), (40,)), ((2, 1, 7, 40), (3, 40, 5)),
                                                  ((40,), (2, 40, 3)), ((2, 0, 5, 40), (1, 40, 6))])
def test_half_precision_batched_and_vector_operands(dtype, a_shape, b_shape):
    a = RNG.standard_normal(a_shape).astype(dtype)
    b = RNG.standard_normal(b_shape).astype(dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    out = np.full(want.shape, np.nan, np.float32)
    c = tf.matmul(a, b, out=out)
    assert c is out
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert_close(c, want, dtype="f32", reduced=40, scale=scale)


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 17, 40), (3, 40, 9)), ((5, 40), (40,)),
                                                  ((40,), (40,)), ((2, 1, 7, 40), (3, 40, 5)),
                                                  ((0, 4, 40), (40, 3)),
                                                  ((2, 0, 5, 40), (1, 40, 6))])
def test_int8_batched_and_vector_operands(a_shape, b_shape):
    """np.matmul's shapes on the 8-bit kernels: exact int32, as NumPy's int64 product."""
    a = RNG.integers(-128, 128, a_shape, dtype=np.int8)
    b = RNG.integers(-128, 128, b_shape, dtype=np.int8)
    want = a.astype(np.int64) @ b.astype(np.int64)
    got = tf.matmul(a, b)
    assert got.dtype == np.int32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_half_precision_transposed_operands(dtype):
    a = RNG.standard_normal((70, 31)).astype(dtype).T  # [31, 70], column-major
    b = RNG.standard_normal((45, 70)).astype(dtype).T[:, ::2]  # [70, 23], strided
    c = tf.matmul(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert_close(c, a64 @ b64, dtype="f32", reduced=70, scale=np.abs(a64) @ np.abs(b64))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_prepacked_half_precision_weights(dtype):
    w = RNG.standard_normal((96, 50)).astype(dtype)
    x = RNG.standard_normal((2, 7, 96)).astype(dtype)
    if widened_source(w.dtype, w.dtype, host_target()) is None:  # a host with bf16/f16 units
        with pytest.raises(tf.DTypeError, match="prepack_lowp"):
            tf.prepack(w)
        return
    packed = tf.prepack(w)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    scale = np.abs(x64) @ np.abs(w64)
    assert_close(tf.matmul(x, packed), x64 @ w64, dtype="f32", reduced=96, scale=scale)
    x32 = x.astype(np.float32)  # the panels are f32: an f32 A may use them
    assert_close(tf.matmul(x32, packed), x64 @ w64, dtype="f32", reduced=96, scale=scale)
