"""Regression tests for the lowering-rule bugs the OpInfo samples found, against float64 NumPy.

Each runs through torch.compile(backend="tilefold") and checks that the whole graph ran in
tilefold; results that are 0-d go through torch.export and the reference interpreter instead
(the compiled path hands 0-d results back as shape [1], a runner bug fixed elsewhere).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from frontend_helpers import lower

from tilefold.frontend import report
from tilefold.ir import interpret

INF = float("inf")


@pytest.fixture(autouse=True)
def no_graph_cache(monkeypatch):
    monkeypatch.setenv("TILEFOLD_GRAPH_CACHE", "0")


def in_tilefold(fn, *args):
    """fn(*args) through the backend, as NumPy; the one graph must have run whole in tilefold."""
    torch._dynamo.reset()
    report.REPORTS.clear()
    with torch.no_grad():
        out = torch.compile(fn, backend="tilefold", dynamic=False)(*args)
    (graph,) = report.reports()
    assert graph.mode == "tilefold" and not graph.fallback, graph.format()
    return _numpy(out)


def interpreted(fn, *args):
    """fn(*args) exported, lowered and run by the reference interpreter, as NumPy."""
    module = lower(fn, *args)
    return interpret(module, *(_numpy(a) for a in args))


def _numpy(t):
    if isinstance(t, list | tuple):
        return [_numpy(x) for x in t]
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def rng(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_clamp_with_min_above_max_gives_max():
    """PyTorch: min(max(x, lo), hi), so lo > hi gives hi everywhere (the rule gave lo)."""
    x = torch.randn(6, 7, generator=rng())
    got = in_tilefold(lambda t: torch.clamp(t, min=0.5, max=-0.25), x)
    np.testing.assert_array_equal(got, np.minimum(np.maximum(f64(x), 0.5), -0.25))


def test_clamp_with_tensor_bounds():
    g = rng(1)
    x, lo, hi = torch.randn(4, 5, generator=g), torch.randn(5, generator=g), torch.randn(4, 1,
                                                                                        generator=g)
    got = in_tilefold(lambda t, a, b: torch.clamp(t, a, b), x, lo, hi)
    np.testing.assert_array_equal(got, np.minimum(np.maximum(f64(x), f64(lo)), f64(hi)))
    got = in_tilefold(lambda t, a: torch.clamp_max(t, a), x, lo)
    np.testing.assert_array_equal(got, np.minimum(f64(x), f64(lo)))


def _pairs(dtype: torch.dtype, n: int = 4000) -> tuple[torch.Tensor, torch.Tensor]:
    """Random dividends and divisors, |divisor| >= 0.1."""
    g = rng(2)
    a = torch.randn(n, generator=g) * 8
    b = torch.sign(torch.randn(n, generator=g)) * (torch.randn(n, generator=g).abs() + 0.1)
    return a.to(dtype), b.to(dtype)


def _low(dtype: torch.dtype) -> type:
    return {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16,
            torch.float32: np.float32}[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_floor_division_floors_the_exact_quotient(dtype):
    """bf16/f16 quotients rounded before the floor landed on the integer above (2.99 -> 3)."""
    a, b = _pairs(dtype)
    got = in_tilefold(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b)
    want = np.floor(f64(a) / f64(b)).astype(_low(dtype))
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_remainder_is_exact_then_rounded_once(dtype):
    """a - floor(a/b)*b with every step rounded to bf16/f16 was off by up to |b|."""
    a, b = _pairs(dtype)
    got = in_tilefold(torch.remainder, a, b).astype(np.float64)
    x, y = f64(a), f64(b)
    info = ml_dtypes.finfo(_low(dtype))
    np.testing.assert_allclose(got, x - np.floor(x / y) * y, rtol=float(info.eps),
                               atol=float(info.smallest_subnormal))


def test_floor_division_and_remainder_by_infinity_follow_python():
    a = torch.tensor([-1.5, 2.0, 0.0, -0.0, INF, 3.0, -3.0, 7.0])
    b = torch.tensor([INF, INF, INF, -INF, INF, -INF, -INF, 0.0])
    want_q = [float(x) // float(y) if y != 0 else INF for x, y in zip(a, b, strict=True)]
    want_r = [(float(x) % float(y) if abs(x) != INF else np.nan) if y != 0 else np.nan
              for x, y in zip(a, b, strict=True)]
    np.testing.assert_array_equal(
        in_tilefold(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b), want_q)
    np.testing.assert_array_equal(in_tilefold(torch.remainder, a, b), want_r)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_trunc_division_of_floats(dtype):
    """trunc of the quotient rounded to the dtype (as PyTorch); ran in PyTorch before."""
    a, b = _pairs(dtype)
    got = in_tilefold(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b)
    np_dtype = np.float32 if dtype == torch.float32 else ml_dtypes.bfloat16
    quotient = (f64(a) / f64(b)).astype(np_dtype).astype(np.float64)
    np.testing.assert_array_equal(got.astype(np.float64), np.trunc(quotient))


def _norm(a: np.ndarray, ord: float) -> np.ndarray:
    a = np.abs(a)
    if ord == INF:
        return a.max(1)
    if ord == -INF:
        return a.min(1)
    if ord == 0:
        return (a != 0).sum(1).astype(np.float64)
    with np.errstate(divide="ignore"):
        return (a**ord).sum(1) ** (1 / ord)


@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3.5, -2.1])
def test_vector_norm_of_any_order(ord):
    x = torch.randn(3, 7, generator=rng(3))
    x[0, 2] = 0.0
    got = in_tilefold(lambda t: torch.linalg.vector_norm(t, ord, dim=1), x)
    np.testing.assert_allclose(got, _norm(f64(x), ord), rtol=2e-6)


def test_addmm_with_alpha_and_beta():
    g = rng(4)
    bias, a, b = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g), torch.randn(
        3, 6, generator=g)
    got = in_tilefold(lambda c, x, y: torch.addmm(c, x, y, beta=0.25, alpha=-1.5), bias, a, b)
    np.testing.assert_allclose(got, 0.25 * f64(bias) - 1.5 * f64(a) @ f64(b), rtol=1e-5,
                               atol=1e-5)
    bias[1, 2] = float("nan")  # beta = 0 ignores the bias, NaNs included
    got = in_tilefold(lambda c, x, y: torch.addmm(c, x, y, beta=0, alpha=2), bias, a, b)
    np.testing.assert_allclose(got, 2 * f64(a) @ f64(b), rtol=1e-5, atol=1e-5)


def test_native_layer_norm_returns_mean_and_rstd():
    x = torch.randn(4, 3, 5, generator=rng(5)) * 3 + 1
    out, mean, rstd = in_tilefold(
        lambda t: torch.ops.aten.native_layer_norm.default(t, [3, 5], None, None, 1e-5), x)
    a = f64(x)
    m = a.mean(axis=(1, 2), keepdims=True)
    r = 1 / np.sqrt(((a - m) ** 2).mean(axis=(1, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(mean, m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, r, rtol=1e-5)
    np.testing.assert_allclose(out, (a - m) * r, rtol=1e-4, atol=1e-5)


# -- 0-d inputs (a rank-0 `dim % rank` raised ZeroDivisionError out of the rules) ----------


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_softmax_of_a_0d_tensor(fn):
    x = torch.randn((), generator=rng(6))
    (got,) = interpreted(lambda t: fn(t, 0), x)
    assert got.shape == ()
    np.testing.assert_allclose(got, 1.0 if fn is torch.softmax else 0.0)


def test_gather_and_index_select_of_a_0d_tensor():
    x, idx = torch.randn((), generator=rng(7)), torch.zeros(1, dtype=torch.int64)
    (got,) = interpreted(lambda t, i: torch.gather(t, 0, i), x, idx)
    np.testing.assert_array_equal(got, np.full(1, f64(x)))
    (got,) = interpreted(lambda t, i: torch.index_select(t, 0, i), x, idx)
    assert got.shape == () and got == f64(x)


def test_reductions_over_dim_0_of_a_0d_tensor_keep_its_element():
    x = torch.randn((), generator=rng(8)) - 2
    cases = [(lambda t: t.sum(0), f64(x)), (lambda t: t.mean(-1, keepdim=True), f64(x)),
             (lambda t: t.amax(0), f64(x)),
             (lambda t: torch.linalg.vector_norm(t, 3.0, dim=0), abs(f64(x)))]
    for fn, want in cases:
        (got,) = interpreted(fn, x)
        assert got.shape == ()
        np.testing.assert_allclose(got, want, rtol=1e-6)
