"""Every lowered pattern against the reference interpreter: elementwise chains with broadcasting
and strided inputs, reductions along each axis, softmax/log_softmax, layer_norm, rms_norm,
mean/var, low-precision inputs and outputs, the AVX2 path and the parallel path."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tolerances import tolerance
from tilefold.codegen.kernel import compile_group
from tilefold.errors import DTypeError, ShapeError, UnsupportedError
from tilefold.ir import functional as F
from tilefold.ir import interpret, trace
from tilefold.target import named_target

SIZES = st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 64, 67, 129])
EXAMPLES = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def check(group, *inputs, dtype: str = "f32", reduced: int = 1, target=None) -> None:
    got = compile_group(group["main"], target)(*inputs)
    want = interpret(group, *inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                   **tolerance(dtype, reduced))


def rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# --- elementwise ------------------------------------------------------------------------
def _chain(x, w, b):
    h = x * w + b
    return F.gelu(h), F.silu(h) - F.tanh(x), F.where(x > 0, F.exp(-F.abs(x)), F.sigmoid(h))


CHAIN = trace(_chain, ("x", "f32", ("n", "m")), ("w", "f32", ("m",)), ("b", "f32", ("n", 1)))


@EXAMPLES
@given(n=SIZES, m=SIZES, seed=st.integers(0, 2**16))
def test_elementwise_chain_with_broadcast(n, m, seed):
    rng = np.random.default_rng(seed)
    check(CHAIN, rand(rng, (n, m), scale=3), rand(rng, (m,)), rand(rng, (n, 1)))


MATH = trace(lambda x: (F.log(F.abs(x) + 1e-3), F.erf(x), F.gelu(x, approximate="tanh"),
                        F.rsqrt(F.abs(x) + 0.5), F.relu(x), F.maximum(x, 0.25 * x)),
             ("x", "f32", ("n",)))


@EXAMPLES
@given(n=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_vecmath_ops_in_kernels(n, seed):
    check(MATH, rand(np.random.default_rng(seed), (n,), scale=4))


@EXAMPLES
@given(n=SIZES, m=SIZES, seed=st.integers(0, 2**16), view=st.sampled_from(["T", "step", "neg"]))
def test_strided_inputs(n, m, seed, view):
    """Transposed, stepped and reversed views are read in place (strides, gathers)."""
    rng = np.random.default_rng(seed)
    x = {"T": lambda: rand(rng, (m, n)).T, "step": lambda: rand(rng, (2 * n, 2 * m))[::2, ::2],
         "neg": lambda: rand(rng, (n, m))[::-1, ::-1]}[view]()
    y = rand(rng, (n, m))
    group = trace(lambda a, b: F.sigmoid(a) * b + a, ("a", "f32", ("n", "m")),
                  ("b", "f32", ("n", "m")))
    check(group, x, y)


def test_transposed_output_order():
    """An output whose axes are permuted relative to the input (transpose inside the group)."""
    rng = np.random.default_rng(0)
    group = trace(lambda a: F.transpose(F.exp(a), (1, 0)) + 1.0, ("a", "f32", (37, 19)))
    check(group, rand(rng, (37, 19)))


# --- reductions -------------------------------------------------------------------------
REDUCTIONS = {
    (name, axis, keep): trace(lambda x, f=fn, a=axis, k=keep: f(x, axis=a, keepdims=k),
                              ("x", "f32", ("a", "b", "c")))
    for name, fn in [("sum", F.sum), ("max", F.max), ("min", F.min), ("mean", F.mean)]
    for axis in (0, 1, 2, (1, 2), None)
    for keep in (False, True)
}


@EXAMPLES
@given(a=SIZES, b=SIZES, c=SIZES, seed=st.integers(0, 2**16),
       key=st.sampled_from(sorted(REDUCTIONS, key=str)))
def test_reductions_along_any_axis(a, b, c, seed, key):
    x = rand(np.random.default_rng(seed), (a, b, c))
    check(REDUCTIONS[key], x, reduced=a * b * c)


def test_reductions_propagate_nan_and_inf():
    x = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 0.0], [-1.0, 2.0, -5.0]], np.float32)
    group = trace(lambda v: (F.max(v, axis=1), F.min(v, axis=1), F.sum(v, axis=1)),
                  ("v", "f32", (3, 3)))
    for g, w in zip(compile_group(group["main"])(x), interpret(group, x), strict=True):
        np.testing.assert_array_equal(g, w)


# --- reduce + elementwise ---------------------------------------------------------------
NORMS = {
    "softmax0": trace(lambda x: F.softmax(x, axis=0), ("x", "f32", ("a", "b", "c"))),
    "softmax1": trace(lambda x: F.softmax(x, axis=1), ("x", "f32", ("a", "b", "c"))),
    "softmax2": trace(lambda x: F.softmax(x, axis=-1), ("x", "f32", ("a", "b", "c"))),
    "log_softmax": trace(lambda x: F.log_softmax(x, axis=-1), ("x", "f32", ("a", "b", "c"))),
    "log_softmax0": trace(lambda x: F.log_softmax(x, axis=0), ("x", "f32", ("a", "b", "c"))),
    "mean_var": trace(lambda x: (F.mean(x, axis=-1), F.mean(
        (x - F.mean(x, axis=-1, keepdims=True)) ** 2.0, axis=-1)), ("x", "f32", ("a", "b", "c"))),
}


@EXAMPLES
@given(a=SIZES, b=SIZES, c=SIZES, seed=st.integers(0, 2**16), key=st.sampled_from(sorted(NORMS)))
def test_softmax_family_and_moments(a, b, c, seed, key):
    x = rand(np.random.default_rng(seed), (a, b, c), scale=3)
    check(NORMS[key], x, reduced=max(a, b, c))


LAYER_NORM = trace(lambda x, w, b: F.layer_norm(x, w, b, eps=1e-5),
                   ("x", "f32", ("a", "c")), ("w", "f32", ("c",)), ("b", "f32", ("c",)))
LAYER_NORM_2D = trace(lambda x, w, b: F.layer_norm(x, w, b, axis=1),
                      ("x", "f32", ("a", "b", "c")), ("w", "f32", ("b", "c")),
                      ("b", "f32", ("b", "c")))
RMS_NORM = trace(lambda x, w: F.rms_norm(x, w), ("x", "f32", ("a", "c")), ("w", "f32", ("c",)))
RESIDUAL_NORM = trace(lambda x, r, w, b: F.layer_norm(x + r, w, b),
                      ("x", "f32", ("a", "c")), ("r", "f32", ("a", "c")), ("w", "f32", ("c",)),
                      ("b", "f32", ("c",)))


@EXAMPLES
@given(a=SIZES, b=SIZES, c=SIZES, seed=st.integers(0, 2**16))
def test_norms(a, b, c, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, (a, c), scale=2) + 3
    w, bias = rand(rng, (c,)), rand(rng, (c,))
    check(LAYER_NORM, x, w, bias, reduced=c * 8)
    check(RMS_NORM, x, w, reduced=c * 8)
    check(RESIDUAL_NORM, x, rand(rng, (a, c)), w, bias, reduced=c * 8)
    check(LAYER_NORM_2D, rand(rng, (a, b, c)), rand(rng, (b, c)), rand(rng, (b, c)),
          reduced=b * c * 8)


# --- dtypes, targets, threads -----------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_low_precision_inputs_and_outputs(dtype):
    rng = np.random.default_rng(1)
    npdt = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    up = trace(lambda x: F.softmax(x.astype("f32"), axis=-1), ("x", dtype, (7, 45)))
    check(up, rand(rng, (7, 45), npdt))
    same = trace(lambda x, w: F.rms_norm(x, w), ("x", dtype, (5, 77)), ("w", dtype, (77,)))
    check(same, rand(rng, (5, 77), npdt), rand(rng, (77,), npdt), dtype=dtype)


def test_where_with_bool_mask():
    rng = np.random.default_rng(2)
    group = trace(lambda s, m: F.softmax(F.where(m, s, -1e9), axis=-1),
                  ("s", "f32", (3, 21)), ("m", "bool", (1, 21)))
    check(group, rand(rng, (3, 21)), rng.random((1, 21)) > 0.3)


@pytest.mark.parametrize("key", ["softmax2", "softmax0", "mean_var"])
def test_avx2_target(key):
    target = named_target("x86-64-v3")
    if not target.is_host():
        pytest.skip("x86-64-v3 code cannot run here")
    x = rand(np.random.default_rng(3), (5, 9, 37))
    check(NORMS[key], x, reduced=37, target=target)
    rng = np.random.default_rng(4)
    check(LAYER_NORM, rand(rng, (13, 101)), rand(rng, (101,)), rand(rng, (101,)),
          reduced=800, target=target)


def test_parallel_rows_and_columns():
    """Big enough to run on every thread: rows split for softmax, columns for axis 0."""
    rng = np.random.default_rng(5)
    x = rand(rng, (96, 1031), scale=4)
    check(NORMS["softmax2"], x[None], reduced=1031)
    check(NORMS["softmax0"], x[:, :, None].repeat(1, 2), reduced=96)
    elementwise = trace(lambda v: F.silu(v) * 2.0, ("v", "f32", ("n",)))
    check(elementwise, rand(rng, (200_003,)))


# --- structure and refusals -------------------------------------------------------------
def test_kernel_text():
    text = compile_group(LAYER_NORM["main"]).kernel_text()
    assert "for r1 reduce(t0 = sum(in0[i0,r1]))" in text
    assert "rsqrt(" in text and "schedule vector r1" in text and "parallel i0" in text


def test_unsupported_groups_are_refused():
    with pytest.raises(UnsupportedError, match="matmul"):
        compile_group(trace(lambda a, b: a @ b, ("a", "f32", (4, 4)), ("b", "f32", (4, 4)))
                      ["main"])
    with pytest.raises(UnsupportedError, match="two of its dims"):
        compile_group(trace(lambda a: a + F.transpose(a), ("a", "f32", (4, 4)))["main"])
    with pytest.raises(UnsupportedError, match="different axes"):
        compile_group(trace(lambda a: (F.sum(a, axis=0), F.sum(a, axis=1)),
                            ("a", "f32", (4, 4)))["main"])


def test_bad_inputs_are_checked_before_running():
    fn = compile_group(RMS_NORM["main"])
    with pytest.raises(ShapeError, match="5 here"):
        fn(np.zeros((3, 4), np.float32), np.zeros((5,), np.float32))
    with pytest.raises(DTypeError, match="expects"):
        fn(np.zeros((3, 4), np.float64), np.zeros((4,), np.float32))


def test_out_buffers_are_written_in_place():
    rng = np.random.default_rng(6)
    x, w = rand(rng, (6, 40)), rand(rng, (40,))
    fn = compile_group(RMS_NORM["main"])
    out = np.empty((6, 40), np.float32)
    (got,) = fn(x, w, out=[out])
    assert got is out
    np.testing.assert_allclose(out, interpret(RMS_NORM, x, w)[0], **tolerance(reduced=320))
    with pytest.raises(ShapeError, match="C-contiguous"):
        fn(x, w, out=[np.empty((40, 6), np.float32).T])
