"""tilefold.matmul against a float64 oracle: shapes, strides, batches, out buffers, prepacking."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilefold.linalg as tl
from tests.gemm.reference import check_matmul

DIMS = [0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 47, 48, 49, 97, 130]
LAYOUTS = ["c", "t", "sliced", "neg_rows", "neg_both"]


def make(rng: np.random.Generator, shape: tuple[int, ...], layout: str) -> np.ndarray:
    """A float32 array of `shape` whose last two dims are laid out as `layout`."""
    lead, (r, c) = shape[:-2], shape[-2:]
    if layout == "t":
        return np.swapaxes(rng.standard_normal((*lead, c, r), dtype=np.float32), -1, -2)
    if layout == "sliced":
        return rng.standard_normal((*lead, 2 * r + 1, 3 * c + 2), dtype=np.float32)[
            ..., 1::2, 2::3][..., :r, :c]
    base = rng.standard_normal(shape, dtype=np.float32)
    if layout == "neg_rows":
        return base[..., ::-1, :]
    if layout == "neg_both":
        return base[..., ::-1, ::-1]
    return base


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.sampled_from(DIMS), n=st.sampled_from(DIMS), k=st.sampled_from(DIMS),
       la=st.sampled_from(LAYOUTS), lb=st.sampled_from(LAYOUTS), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_shapes_and_strides(m, n, k, la, lb, threads, seed):
    rng = np.random.default_rng(seed)
    a, b = make(rng, (m, k), la), make(rng, (k, n), lb)
    check_matmul(tl.matmul(a, b, threads=threads), a, b)


@settings(max_examples=25, deadline=None)
@given(batch_a=st.sampled_from([(), (1,), (3,), (2, 1), (1, 4), (2, 3)]),
       batch_b=st.sampled_from([(), (1,), (3,), (2, 1), (1, 3), (2, 3)]),
       m=st.sampled_from([1, 5, 17]), n=st.sampled_from([1, 9, 50]), k=st.sampled_from([1, 33]),
       threads=st.sampled_from([1, 2]))
def test_batch_broadcasting(batch_a, batch_b, m, n, k, threads):
    try:
        np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        return
    rng = np.random.default_rng(0)
    a = rng.standard_normal((*batch_a, m, k), dtype=np.float32)
    b = make(rng, (*batch_b, k, n), "t")
    check_matmul(tl.matmul(a, b, threads=threads), a, b)


@pytest.mark.parametrize("ash, bsh", [((5,), (5,)), ((4, 5), (5,)), ((5,), (5, 6)),
                                      ((2, 3, 5), (5,)), ((5,), (2, 5, 3))])
def test_one_dimensional_operands(ash, bsh):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(ash, dtype=np.float32)
    b = rng.standard_normal(bsh, dtype=np.float32)
    got = tl.matmul(a, b)
    assert got.shape == np.matmul(a, b).shape
    check_matmul(got, a, b)


@pytest.mark.parametrize("m, n, k, la, lb", [
    (1, 777, 999, "c", "c"), (1, 777, 999, "c", "t"), (1, 777, 999, "t", "t"),
    (555, 1, 333, "c", "c"), (555, 1, 333, "t", "c"), (1, 1, 4099, "c", "c"),
    (1, 4096, 64, "c", "sliced"), (300, 1, 17, "neg_both", "neg_rows")])
@pytest.mark.parametrize("threads", [1, 2])
def test_matrix_vector(m, n, k, la, lb, threads):
    rng = np.random.default_rng(2)
    a, b = make(rng, (m, k), la), make(rng, (k, n), lb)
    check_matmul(tl.matmul(a, b, threads=threads), a, b)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (13, 47, 29), (97, 130, 300), (300, 8, 64),
                                     (2, 2000, 70), (64, 64, 0)])
def test_poisoned_out_is_fully_written_and_never_read(m, n, k):
    """beta = 0 must not read C: NaN garbage in `out` may not leak into the result."""
    rng = np.random.default_rng(3)
    a, b = make(rng, (m, k), "c"), make(rng, (k, n), "c")
    out = np.full((m, n), np.nan, np.float32)
    assert tl.matmul(a, b, out=out) is out
    check_matmul(out, a, b)


def test_strided_out_view():
    rng = np.random.default_rng(4)
    a, b = make(rng, (37, 19), "c"), make(rng, (19, 53), "c")
    big = np.full((80, 120), np.nan, np.float32)
    view = big[3:77:2, 5:111:2]
    tl.matmul(a, b, out=view)
    check_matmul(view, a, b)
    untouched = np.ones(big.shape, bool)
    untouched[3:77:2, 5:111:2] = False
    assert np.isnan(big[untouched]).all(), "wrote outside the out view"


@pytest.mark.parametrize("form", ["x@W rows", "x@W cols", "W@x rows", "W@x cols"])
def test_matrix_vector_every_tail(form):
    """Both GEMV forms (dot and axpy) on every k and output count around the vector width and the
    row blocks, into a NaN-filled C (beta 0: never read) and accumulating into C (beta 1); k
    also past the dot form's groups of four vectors (64 f32 on AVX-512) and their tails."""
    from tilefold.codegen.llvm.gemm.module import gemm_module
    from tilefold.codegen.llvm.gemm.plan import EmptyKPlan, GemvPlan, make_plan

    rng = np.random.default_rng(11)
    module = gemm_module()
    for k in [*range(0, 35), 61, 64, 79, 130]:
        for outs in (1, 3, 4, 5, 8, 9, 16, 17, 33, 47, 57):
            matrix = make(rng, (k, outs) if form.startswith("x") else (outs, k),
                          "c" if form.endswith("rows") else "t")
            vector = rng.standard_normal((1, k) if form.startswith("x") else (k, 1),
                                         dtype=np.float32)
            a, b = (vector, matrix) if form.startswith("x") else (matrix, vector)
            for beta in (0, 1):
                c0 = rng.standard_normal((a.shape[0], b.shape[1]), dtype=np.float32)
                c = c0.copy() if beta else np.full_like(c0, np.nan)
                plan = make_plan(module, a, b, c, beta, 2)
                assert isinstance(plan, GemvPlan if k else EmptyKPlan)
                plan(a, b, c)
                if beta:
                    ref = a.astype(np.float64) @ b + c0
                    assert np.allclose(c, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k + 1)), (k, outs)
                else:
                    check_matmul(c, a, b)


def test_accumulate_into_c():
    """C += A @ B (beta = 1) through the plan API, on every edge-tile size."""
    from tilefold.codegen.llvm.gemm.module import gemm_module
    from tilefold.codegen.llvm.gemm.plan import make_plan

    rng = np.random.default_rng(5)
    for m, n, k in [(9, 50, 31), (1, 1, 3), (64, 96, 300)]:
        a, b = make(rng, (m, k), "c"), make(rng, (k, n), "t")
        c0 = rng.standard_normal((m, n), dtype=np.float32)
        c = c0.copy()
        make_plan(gemm_module(), a, b, c, 1, 2)(a, b, c)
        ref = a.astype(np.float64) @ b + c0
        assert np.allclose(c, ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("m", [1, 7, 64, 300])
def test_prepacked_weights_are_reused(m):
    rng = np.random.default_rng(6)
    w = make(rng, (123, 101), "t")
    packed = tl.prepack(w)
    for seed in range(2):
        x = np.random.default_rng(seed).standard_normal((m, 123), dtype=np.float32)
        check_matmul(tl.matmul(x, packed), x, w)
    xb = rng.standard_normal((2, 3, m, 123), dtype=np.float32)
    check_matmul(tl.matmul(xb, packed), xb, w)


def test_non_finite_values_propagate_like_numpy():
    a = np.ones((20, 40), np.float32)
    b = np.ones((40, 70), np.float32)
    a[3, 5] = np.nan
    a[7, 1] = np.inf
    b[1, 9] = 0.0  # inf * 0 -> NaN in column 9 of row 7
    b[2, 60] = -np.inf
    got = tl.matmul(a, b)
    with np.errstate(invalid="ignore"):
        ref = np.matmul(a, b)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])


def test_other_dtypes_fall_back_to_numpy_with_a_note(caplog):
    a = np.arange(6.0).reshape(2, 3)
    b = np.arange(12.0).reshape(3, 4)
    with caplog.at_level("INFO", logger="tilefold.kernels"):
        got = tl.matmul(a, b)
        tl.matmul(a.astype(np.int32), b.astype(np.int32))
    assert got.dtype == np.float64 and np.array_equal(got, a @ b)
    assert "extern" in caplog.text


def test_misaligned_and_odd_strided_inputs_are_copied():
    raw = np.zeros(4 * 60 + 1, np.uint8)
    a = np.frombuffer(raw.data, np.float32, 60, offset=1).reshape(6, 10)  # address % 4 == 1
    rec = np.zeros((10, 7), dtype=[("x", np.float32), ("pad", np.uint8)])  # 5-byte strides
    rec["x"] = np.random.default_rng(7).standard_normal((10, 7))
    b = rec["x"]
    assert not a.flags.aligned and not b.flags.aligned
    check_matmul(tl.matmul(a, b), a, b)


def test_large_sizes_cross_cache_blocks():
    rng = np.random.default_rng(9)
    a, b = make(rng, (700, 1100), "c"), make(rng, (1100, 900), "t")
    check_matmul(tl.matmul(a, b), a, b)
