"""The AVX2 int8 GEMM on codes widened to s16 while packing: chosen on x86-64-v3 only, and exact
(int64 NumPy) for u8 and s8 A on odd shapes, operand extremes and sums near the int32 limit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tilefold
from tests.quant.levels import target_for
from tilefold.codegen.llvm.lowp.kernels import describe_lowp, select_dot_kernel
from tilefold.quant import matmul_lowp, prepack_lowp
from tilefold.target import named_target

V3 = target_for("x86-64-v3")
ROW = "u8s8_s16_avx2_6x16"
DIMS = (1, 2, 3, 5, 7, 17, 31, 64, 129)
A_DTYPES = (np.uint8, np.int8)


def _exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.int64) @ b.astype(np.int64)


def _random(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("kind", ["u8s8", "s8s8"])
def test_avx2_targets_choose_the_s16_row_and_wider_ones_keep_theirs(kind):
    assert select_dot_kernel(V3, kind).name == ROW
    assert select_dot_kernel(named_target("x86-64-v3"), kind).name == ROW
    assert select_dot_kernel(named_target("x86-64-v4"), kind).name == "u8s8_avx512bw_6x32"
    assert select_dot_kernel(named_target("znver4"), kind).dot == "dpbusd"
    assert select_dot_kernel(named_target("sapphirerapids"), kind).is_amx


def test_signed_a_needs_no_compensation_on_the_s16_row():
    kernel = select_dot_kernel(V3, "s8s8")
    assert kernel.s16_codes and not kernel.shifts_signed_a
    assert "s8 widened to s16, exact" in "\n".join(describe_lowp(V3))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("a_dtype", A_DTYPES, ids=["u8", "s8"])
def test_odd_shapes_are_exact(rng, a_dtype, threads):
    """Every (M, K, N) of DIMS: tails of the 6-row and 16-column tile, odd K (a half-filled
    last k-pair) and 129 (rows, columns and k-pairs all ragged)."""
    for m, k, n in itertools.product(DIMS, repeat=3):
        a = _random(rng, a_dtype, (m, k))
        b = _random(rng, np.int8, (k, n))
        c = matmul_lowp(a, b, target=V3, threads=threads)
        assert c.dtype == np.int32
        assert np.array_equal(c, _exact(a, b)), (m, k, n)


@pytest.mark.parametrize("a_dtype", A_DTYPES, ids=["u8", "s8"])
def test_extremes_of_both_operands_do_not_saturate(rng, a_dtype):
    """A all at its minimum or maximum (0/255, -128/127), B all -128 or 127, and each mixed
    at random between its extremes, over K that spans several KC blocks."""
    info = np.iinfo(a_dtype)
    m, k, n = 13, 2049, 35
    a_fills = [np.full((m, k), v, a_dtype) for v in (info.min, info.max)]
    a_fills.append(rng.choice(np.array([info.min, info.max], a_dtype), (m, k)))
    b_fills = [np.full((k, n), v, np.int8) for v in (-128, 127)]
    b_fills.append(rng.choice(np.array([-128, 127], np.int8), (k, n)))
    for (a, b), threads in itertools.product(itertools.product(a_fills, b_fills), (1, 2)):
        assert np.array_equal(matmul_lowp(a, b, target=V3, threads=threads), _exact(a, b))


def test_sums_near_the_int32_limit_are_exact():
    """255 * -128 over K = 65000 is -2,121,600,000: one pair of products per `vpmaddwd`
    lane, summed in i32 without any 16-bit saturation (what `pmaddubsw` would clip)."""
    k = 65000
    for a_val, dtype in ((255, np.uint8), (-128, np.int8), (127, np.int8)):
        a = np.full((3, k), a_val, dtype)
        for b_val in (-128, 127):
            b = np.full((k, 17), b_val, np.int8)
            c = matmul_lowp(a, b, target=V3)
            assert (c.astype(np.int64) == a_val * b_val * k).all()


@pytest.mark.parametrize("a_dtype", A_DTYPES, ids=["u8", "s8"])
def test_prepacked_strided_and_public_matmul(rng, a_dtype):
    """Prepacked B, B read through column strides and a broadcast row, batched A, and
    `tilefold.matmul`, all equal to the exact product."""
    a = _random(rng, a_dtype, (2, 9, 77))
    b = _random(rng, np.int8, (77, 90))[:, ::3]
    exact = _exact(a, b)
    packed = prepack_lowp(b, a_dtype, target=V3)
    assert packed.kernel.name == ROW
    for threads in (1, 2):
        assert np.array_equal(matmul_lowp(a, packed, target=V3, threads=threads), exact)
        assert np.array_equal(matmul_lowp(a, b, target=V3, threads=threads), exact)
    row = np.broadcast_to(_random(rng, np.int8, (1, 30)), (77, 30))
    assert np.array_equal(matmul_lowp(a, row, target=V3), _exact(a, row))
    if select_dot_kernel(target_for("host"), "u8s8").name == ROW:
        assert np.array_equal(tilefold.matmul(a[0], b), exact[0])


def test_dequantized_s8s8_on_the_s16_row(rng):
    """The f32 epilogue (row scale * column scale + bias) on sums of signed A, which this row
    takes without the +128 shift."""
    a = _random(rng, np.int8, (11, 301))
    b = _random(rng, np.int8, (301, 37))
    rs, cs, bias = rng.uniform(0.1, 1, 11), rng.uniform(0.1, 1, 37), rng.standard_normal(37)
    c = matmul_lowp(a, b, row_scale=rs, col_scale=cs, bias=bias, target=V3)
    ref = _exact(a, b) * rs[:, None].astype(np.float32) * cs.astype(np.float32) + bias
    assert c.dtype == np.float32
    assert np.allclose(c, ref, rtol=3e-7 * 4, atol=1e-5)
