"""`random_uniform`: the reference draw's statistics, and the native kernel bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tilefold
from tilefold import dtypes
from tilefold.errors import DTypeError
from tilefold.ir import Builder, interpret
from tilefold.ir.ops.random import uniform
from tilefold.ir.types import SymDim

N = 1 << 18


def test_draw_is_uniform_on_the_unit_interval():
    u = uniform(2024, 0, N).astype(np.float64)
    assert u.dtype == np.float64 and u.min() >= 0.0 and u.max() < 1.0
    sigma = math.sqrt(1 / 12 / N)
    assert abs(u.mean() - 0.5) < 6 * sigma
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    chi2 = ((counts - N / 64) ** 2 / (N / 64)).sum()
    assert chi2 < 63 + 6 * math.sqrt(2 * 63)  # 63 degrees of freedom, 6 sigma
    for lag in (1, 2, 8, 16, 1024):  # neighbours, vector lanes and vectors are unrelated
        assert abs(np.corrcoef(u[:-lag], u[lag:])[0, 1]) < 6 / math.sqrt(N)


@pytest.mark.parametrize("other", [(2025, 0), (2024, 1), (-2024, 0), (2024 + (1 << 32), 0)])
def test_seeds_and_streams_draw_unrelated_numbers(other):
    u, v = uniform(2024, 0, N), uniform(*other, N)
    assert not np.array_equal(u, v)
    assert abs(np.corrcoef(u, v)[0, 1]) < 6 / math.sqrt(N)
    assert abs(np.mean(u < 0.5) - np.mean((u < 0.5) & (v < 0.5)) * 2) < 12 / math.sqrt(N)


def test_draw_is_a_function_of_the_seed_and_counter():
    assert np.array_equal(uniform(7, 3, 1000), uniform(7, 3, 1000))
    assert np.array_equal(uniform(7, 3, 1000)[:17], uniform(7, 3, 17))  # length-independent


def _module(shape, stream=0):
    b = Builder("main")
    seed = b.arg("seed", dtypes.i64, ())
    out = b.op("random_uniform", seed, shape=shape, stream=stream)
    b.build(out, b.op("mul", out, out))
    return b.module


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 257, 100_003])
def test_kernel_matches_the_reference_bit_for_bit(n):
    module = _module((n,), stream=5)
    compiled = tilefold.compile(module, strict=True)
    for seed in (0, 1, -1, 2**62 + 12345):
        s = np.asarray(seed, np.int64)
        want, got = interpret(module, s), compiled(s)
        assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))
    assert next(d.winner.method for d in compiled.decisions(())) == "handwritten.random"


def test_one_kernel_for_a_symbolic_shape_draws_row_major():
    b = Builder("main")
    seed = b.arg("seed", dtypes.i64, ())
    x = b.arg("x", dtypes.f32, (3, SymDim("s")))
    drawn = b.op("random_uniform", seed, shape=(3, SymDim("s")), stream=2)
    b.build(b.op("mul", drawn, x))
    compiled = tilefold.compile(b.module, strict=True)
    rng = np.random.default_rng(0)
    for length in (1, 5, 64, 1031):
        x = rng.standard_normal((3, length)).astype(np.float32)
        (got,) = compiled(np.asarray(99, np.int64), x)
        assert np.array_equal(got, uniform(99, 2, 3 * length).reshape(3, length) * x)


def test_a_seed_of_another_dtype_is_refused():
    b = Builder("main")
    seed = b.arg("seed", dtypes.i32, ())
    with pytest.raises(DTypeError, match="random_uniform"):
        b.op("random_uniform", seed, shape=(4,))
