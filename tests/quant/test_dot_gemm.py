"""bf16/f16 and 8-bit GEMMs: every registered micro-kernel forced and checked (ints bit-exact),
K blocking, signed-A compensation and the dequantizing epilogue."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.quant.levels import LEVELS, target_for
from tilefold.codegen.lowp.kernels import DOT_KERNELS, select_dot_kernel
from tilefold.quant import matmul_lowp, prepack_lowp
from tilefold.quant.accuracy import matmul_bound

SHAPES = [(1, 1, 1), (7, 13, 50), (33, 301, 97), (20, 3000, 49)]  # the last has 2+ K blocks
FLOATS = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def _level_of(kernel) -> str:
    """A target on this host whose selection yields `kernel` (the host's best, or a fallback)."""
    for level in LEVELS:
        if select_dot_kernel(target_for(level), kernel.dtype) == kernel:
            return level
    pytest.skip(f"{kernel.name} is not reachable on this host")


@pytest.mark.parametrize("kernel", [k for k in DOT_KERNELS if k.dtype != "u8s8"],
                         ids=lambda k: k.name)
def test_float_kernels_within_bound(rng, kernel):
    target = target_for(_level_of(kernel))
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(FLOATS[kernel.dtype])
        b = rng.standard_normal((k, n)).astype(FLOATS[kernel.dtype])
        c = matmul_lowp(a, b, target=target)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert c.dtype == np.float32
        assert (np.abs(c - ref) <= matmul_bound(a, b)).all()


@pytest.mark.parametrize("kernel", [k for k in DOT_KERNELS if k.dtype == "u8s8"],
                         ids=lambda k: k.name)
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
def test_int8_kernels_bit_exact(rng, kernel, a_dtype):
    target = target_for(_level_of(kernel))
    info = np.iinfo(a_dtype)
    for m, k, n in SHAPES:
        a = rng.integers(info.min, info.max + 1, (m, k)).astype(a_dtype)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
        c = matmul_lowp(a, b, target=target)
        assert c.dtype == np.int32
        assert np.array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


def test_int8_extremes_do_not_saturate():
    a = np.full((4, 512), 255, np.uint8)
    b = np.full((512, 16), -128, np.int8)
    for level in LEVELS:
        c = matmul_lowp(a, b, target=target_for(level))
        assert (c == 255 * -128 * 512).all()


def test_dequantizing_epilogue(rng):
    a = rng.integers(-128, 128, (9, 200)).astype(np.int8)
    b = rng.integers(-128, 128, (200, 40)).astype(np.int8)
    rs, cs, bias = rng.uniform(0.1, 1, 9), rng.uniform(0.1, 1, 40), rng.standard_normal(40)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    for level in LEVELS:
        c = matmul_lowp(a, b, row_scale=rs, col_scale=cs, bias=bias, target=target_for(level))
        ref = exact * rs[:, None].astype(np.float32) * cs.astype(np.float32) + bias
        assert c.dtype == np.float32
        assert np.allclose(c, ref, rtol=3e-7 * 4, atol=1e-5)


def test_prepacked_b_and_batched_a(rng):
    b = rng.standard_normal((64, 30)).astype(ml_dtypes.bfloat16)
    packed = prepack_lowp(b, "bf16")
    a = rng.standard_normal((2, 3, 64)).astype(ml_dtypes.bfloat16)
    c = matmul_lowp(a, packed)
    assert c.shape == (2, 3, 30)
    assert np.array_equal(c, matmul_lowp(a, b))


def test_host_picks_the_special_instructions():
    host = target_for("host")
    if host.has("avx512bf16"):
        assert select_dot_kernel(host, "bf16").dot == "dpbf16"
    if host.has("avx512vnni"):
        assert select_dot_kernel(host, "u8s8").dot == "dpbusd"
    assert select_dot_kernel(target_for("x86-64-v3"), "u8s8").dot == "dpbusd_pmaddwd"
