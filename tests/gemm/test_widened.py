"""bf16/f16 operands widened to f32 while packed, then the f32 GEMM: shapes, strides, batches,
pre-packed B and every bit pattern, against float64 NumPy on the rounded operands."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold.codegen.llvm.gemm.driver import BMode
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.errors import UnsupportedError
from tilefold.target import host_target, named_target

V3 = host_target("x86-64-v3")
DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
# 1s, primes, M == N == K, K of no useful factor, a row tail of every height, K over one block.
SHAPES = [(1, 1, 1), (1, 37, 19), (23, 1, 5), (13, 13, 13), (97, 97, 97), (31, 263, 41),
          (7, 301, 17), (64, 127, 96), (6, 16, 1), (257, 521, 33), (1, 23, 91)]


@pytest.fixture(params=sorted(DTYPES))
def src(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _module(src):
    return gemm_module(V3, select_microkernel(V3), src)


def _run(src, a, b, threads=2, **kw):
    batch = np.broadcast_shapes(a.shape[:-2], getattr(b, "shape", (0, 0))[:-2])
    c = np.empty((*batch, a.shape[-2], b.shape[-1]), np.float32)
    plan = make_plan(_module(src), a, b, c, 0, threads, **kw)
    plan(a, b.data if isinstance(b, PackedMatrix) else b, c)
    return c


def _check(c, a, b):
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert c.dtype == np.float32
    assert_close(c, a64 @ b64, dtype="f32", reduced=a.shape[-1], scale=np.abs(a64) @ np.abs(b64))


def _rand(rng, shape, src):
    return rng.standard_normal(shape).astype(DTYPES[src])


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_widened_gemm_matches_float64(rng, src, m, k, n):
    a, b = _rand(rng, (m, k), src), _rand(rng, (k, n), src)
    _check(_run(src, a, b), a, b)


@pytest.mark.parametrize("layout", ["a_t", "b_t", "both_t", "strided"])
def test_transposed_and_strided_operands(rng, src, layout):
    m, k, n = 45, 133, 38
    a, b = _rand(rng, (m, k), src), _rand(rng, (k, n), src)
    if layout in ("a_t", "both_t"):
        a = np.ascontiguousarray(a.T).T
    if layout in ("b_t", "both_t"):
        b = np.ascontiguousarray(b.T).T
    if layout == "strided":
        a = _rand(rng, (2 * m, 3 * k), src)[::2, ::3]
        b = _rand(rng, (k, 2 * n + 1), src)[:, 1::2]
    _check(_run(src, a, b), a, b)


def test_batched_and_broadcast(rng, src):
    a = _rand(rng, (2, 3, 17, 29), src)
    b = _rand(rng, (3, 29, 23), src)
    _check(_run(src, a, b), a, b)
    w = _rand(rng, (29, 23), src)
    _check(_run(src, a, w), a, w)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (5, 300, 37), (66, 64, 130)])
def test_prepacked_b_is_widened_once(rng, src, m, k, n):
    a, b = _rand(rng, (m, k), src), _rand(rng, (k, n), src)
    packed = PackedMatrix(b, _module(src))
    assert packed.data.dtype == np.float32
    c = _run(src, a, packed)
    _check(c, a, b)
    assert np.array_equal(c, _run(src, a, b))
    # f32 panels: an f32 A may use them too (the f32 module of the same micro-kernel)
    a32 = a.astype(np.float32)
    c32 = np.empty((m, n), np.float32)
    make_plan(gemm_module(V3, select_microkernel(V3)), a32, packed, c32, 0, 1)(
        a32, packed.data, c32)
    _check(c32, a32, b)


def test_every_bit_pattern_widens_exactly(src):
    """K = 1 with the other operand 1.0: C is each element of A (then B) widened to f32."""
    codes = np.arange(1 << 16, dtype=np.uint16).view(DTYPES[src])
    one = np.ones((1, 1), DTYPES[src])
    for c, want in ((_run(src, codes.reshape(-1, 1), one), codes.reshape(-1, 1)),
                    (_run(src, one, codes.reshape(1, -1)), codes.reshape(1, -1))):
        want = want.astype(np.float32)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(c), nan)
        assert np.array_equal(c[~nan], want[~nan])  # (-0 comes back +0: C = 0 + a * 1)


def test_widened_modules_refuse_what_they_cannot_do(rng):
    with pytest.raises(UnsupportedError, match="F16C"):
        gemm_module(named_target("generic"), None, "f16")
    narrow = select_microkernel(V3, shape_class="narrow")
    assert narrow.a_direct
    with pytest.raises(UnsupportedError, match="reads A in place"):
        gemm_module(V3, narrow, "bf16")
    with pytest.raises(UnsupportedError, match="no packing from"):
        gemm_module(V3, None, "f64")
    a, b = _rand(rng, (4, 8), "bf16"), _rand(rng, (8, 16), "bf16")
    with pytest.raises(UnsupportedError, match="in place"):
        _run("bf16", a, b, bmode=BMode.DIRECT)


def test_f32_gemm_still_reads_in_place():
    """A widened GEMM packs A and B; f32 plans of the same shapes keep their fast paths, and
    a widened matrix-vector product reads its 2-byte operands in place (the GEMV)."""
    a, b = np.ones((2, 64), np.float32), np.ones((64, 32), np.float32)
    c = np.empty((2, 32), np.float32)
    assert make_plan(gemm_module(V3), a, b, c, 0, 1).bmode == BMode.DIRECT
    bf = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    plan = make_plan(_module("bf16"), *bf, c, 0, 1)
    assert plan.bmode == BMode.PACK and not plan.kernel.a_direct
    row = np.empty((1, 32), np.float32)
    assert type(make_plan(gemm_module(V3), a[:1], b, row, 0, 1)).__name__ == "GemvPlan"
    assert type(make_plan(_module("bf16"), bf[0][:1], bf[1], row, 0, 1)).__name__ == "GemvPlan"


@pytest.mark.parametrize("target", sorted({V3, host_target()}, key=lambda t: t.name),
                         ids=lambda t: t.name)
def test_widened_matrix_vector_every_tail(rng, src, target):
    """x @ W with 2-byte x and W (the GEMV's axpy form: bf16 W read as pairs, y split into
    even and odd elements while it runs) on output counts around every step width, rows of K
    around the 8-row blocks, into a NaN-filled y (beta 0) and accumulating into y (beta 1)."""
    module = gemm_module(target, select_microkernel(target), src)
    for k in (1, 7, 8, 9, 19):
        for outs in (1, 8, 15, 16, 17, 31, 32, 33, 47, 57, 64, 91, 100):
            x, w = _rand(rng, (1, k), src), _rand(rng, (k, outs), src)
            x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
            for beta in (0, 1):
                for threads in (1, 2):
                    y0 = rng.standard_normal((1, outs), dtype=np.float32)
                    y = y0.copy() if beta else np.full_like(y0, np.nan)
                    plan = make_plan(module, x, w, y, beta, threads)
                    assert type(plan).__name__ == "GemvPlan"
                    plan(x, w, y)
                    want = x64 @ w64 + (y0 if beta else 0)
                    assert_close(y, want, dtype="f32", reduced=k + 1,
                                 scale=np.abs(x64) @ np.abs(w64) + np.abs(want))
