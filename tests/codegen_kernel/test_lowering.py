"""Every lowered pattern against float64 NumPy: elementwise chains with broadcasting and strided
inputs, reductions along each axis, softmax/log_softmax, layer_norm, rms_norm, mean/var,
low-precision inputs and outputs, the AVX2 path and the parallel path. Tolerances follow the
one rule of tests/tolerances.py, by dtype and reduced length."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tolerances import assert_close
from tilefold.codegen.kernel import compile_group
from tilefold.errors import DTypeError, ShapeError, UnsupportedError
from tilefold.ir import functional as F
from tilefold.ir import trace
from tilefold.target import named_target

SIZES = st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 64, 67, 129])
EXAMPLES = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
erf = np.vectorize(math.erf, otypes=[np.float64])


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def f32(c: float) -> float:
    """A Python constant as the f32 the traced program holds."""
    return float(np.float32(c))


def check(group, *inputs, want, dtype: str = "f32", reduced: int = 1, scale=None,
          target=None) -> None:
    """The compiled group on `inputs` against `want` (float64 NumPy results, one per output)."""
    got = compile_group(group["main"], target)(*inputs)
    types = group["main"].result_types
    assert len(got) == len(want) == len(types)
    for g, w, t in zip(got, want, types, strict=True):
        assert g.dtype == t.dtype.np_dtype
        assert_close(g, w, dtype=dtype, reduced=reduced, scale=scale)


def rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# --- elementwise ------------------------------------------------------------------------
def _chain(x, w, b):
    h = x * w + b
    return F.gelu(h), F.silu(h) - F.tanh(x), F.where(x > 0, F.exp(-F.abs(x)), F.sigmoid(h))


CHAIN = trace(_chain, ("x", "f32", ("n", "m")), ("w", "f32", ("m",)), ("b", "f32", ("n", 1)))


@EXAMPLES
@given(n=SIZES, m=SIZES, seed=st.integers(0, 2**16))
def test_elementwise_chain_with_broadcast(n, m, seed):
    rng = np.random.default_rng(seed)
    x, w, b = rand(rng, (n, m), scale=3), rand(rng, (m,)), rand(rng, (n, 1))
    x64 = f64(x)
    h = x64 * f64(w) + f64(b)
    want = (0.5 * h * (1 + erf(h / math.sqrt(2))), h * sigmoid(h) - np.tanh(x64),
            np.where(x64 > 0, np.exp(-np.abs(x64)), sigmoid(h)))
    check(CHAIN, x, w, b, want=want, scale=np.abs(h) + np.abs(x64))  # terms' sizes


MATH = trace(lambda x: (F.log(F.abs(x) + 1e-3), F.erf(x), F.gelu(x, approximate="tanh"),
                        F.rsqrt(F.abs(x) + 0.5), F.relu(x), F.maximum(x, 0.25 * x)),
             ("x", "f32", ("n",)))


@EXAMPLES
@given(n=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_vecmath_ops_in_kernels(n, seed):
    x = rand(np.random.default_rng(seed), (n,), scale=4)
    v = f64(x)
    tanh_gelu = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + f32(0.044715) * v**3)))
    want = (np.log(np.abs(v) + f32(1e-3)), erf(v), tanh_gelu, 1 / np.sqrt(np.abs(v) + 0.5),
            np.maximum(v, 0), np.maximum(v, 0.25 * v))
    check(MATH, x, want=want, scale=np.abs(v))


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
    a, b = f64(x), f64(y)
    check(group, x, y, want=[sigmoid(a) * b + a], scale=np.abs(a) + np.abs(b))


def test_transposed_output_order():
    """An output whose axes are permuted relative to the input (transpose inside the group)."""
    x = rand(np.random.default_rng(0), (37, 19))
    group = trace(lambda a: F.transpose(F.exp(a), (1, 0)) + 1.0, ("a", "f32", (37, 19)))
    check(group, x, want=[np.exp(f64(x)).T + 1.0])


# --- reductions -------------------------------------------------------------------------
REDUCERS = {"sum": (F.sum, np.sum), "max": (F.max, np.max), "min": (F.min, np.min),
            "mean": (F.mean, np.mean)}
REDUCTIONS = {
    (name, axis, keep): trace(lambda x, f=fn, a=axis, k=keep: f(x, axis=a, keepdims=k),
                              ("x", "f32", ("a", "b", "c")))
    for name, (fn, _) in REDUCERS.items()
    for axis in (0, 1, 2, (1, 2), None)
    for keep in (False, True)
}


@EXAMPLES
@given(a=SIZES, b=SIZES, c=SIZES, seed=st.integers(0, 2**16),
       key=st.sampled_from(sorted(REDUCTIONS, key=str)))
def test_reductions_along_any_axis(a, b, c, seed, key):
    name, axis, keep = key
    x = rand(np.random.default_rng(seed), (a, b, c))
    (got,) = compile_group(REDUCTIONS[key]["main"])(x)
    want = REDUCERS[name][1](f64(x), axis=axis, keepdims=keep)
    if name in ("max", "min"):  # exact: the result is one of the inputs
        np.testing.assert_array_equal(got, want.astype(np.float32))
        return
    axes = range(3) if axis is None else np.atleast_1d(axis)
    reduced = math.prod(x.shape[i] for i in axes)
    assert_close(got, want, dtype="f32", reduced=reduced, scale=np.abs(x).max())


def test_reductions_propagate_nan_and_inf():
    x = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 0.0], [-1.0, 2.0, -5.0]], np.float32)
    group = trace(lambda v: (F.max(v, axis=1), F.min(v, axis=1), F.sum(v, axis=1)),
                  ("v", "f32", (3, 3)))
    want = [np.array(w, np.float32) for w in ([np.nan, np.inf, 2], [np.nan, -np.inf, -5],
                                              [np.nan, np.nan, -4])]
    for g, w in zip(compile_group(group["main"])(x), want, strict=True):
        np.testing.assert_array_equal(g, w)


# --- reduce + elementwise ---------------------------------------------------------------
def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def mean_var(x):
    mean = x.mean(axis=-1, keepdims=True)
    return mean[..., 0], ((x - mean) ** 2).mean(axis=-1)


XABC = ("x", "f32", ("a", "b", "c"))
# name -> (group, NumPy's float64 results, the reduced axis)
NORMS = {
    "softmax0": (trace(lambda x: F.softmax(x, axis=0), XABC), lambda x: [softmax(x, 0)], 0),
    "softmax1": (trace(lambda x: F.softmax(x, axis=1), XABC), lambda x: [softmax(x, 1)], 1),
    "softmax2": (trace(lambda x: F.softmax(x, axis=-1), XABC), lambda x: [softmax(x, -1)], 2),
    "log_softmax": (trace(lambda x: F.log_softmax(x, axis=-1), XABC),
                    lambda x: [log_softmax(x, -1)], 2),
    "log_softmax0": (trace(lambda x: F.log_softmax(x, axis=0), XABC),
                     lambda x: [log_softmax(x, 0)], 0),
    "mean_var": (trace(lambda x: (F.mean(x, axis=-1), F.mean(
        (x - F.mean(x, axis=-1, keepdims=True)) ** 2.0, axis=-1)), XABC), mean_var, 2),
}


def check_norm(key: str, x: np.ndarray, target=None) -> None:
    group, reference, axis = NORMS[key]
    check(group, x, want=reference(f64(x)), reduced=x.shape[axis], scale=np.abs(x).max(),
          target=target)


@EXAMPLES
@given(a=SIZES, b=SIZES, c=SIZES, seed=st.integers(0, 2**16), key=st.sampled_from(sorted(NORMS)))
def test_softmax_family_and_moments(a, b, c, seed, key):
    check_norm(key, rand(np.random.default_rng(seed), (a, b, c), scale=3))


LAYER_NORM = trace(lambda x, w, b: F.layer_norm(x, w, b, eps=1e-5),
                   ("x", "f32", ("a", "c")), ("w", "f32", ("c",)), ("b", "f32", ("c",)))
LAYER_NORM_2D = trace(lambda x, w, b: F.layer_norm(x, w, b, axis=1),
                      ("x", "f32", ("a", "b", "c")), ("w", "f32", ("b", "c")),
                      ("b", "f32", ("b", "c")))
RMS_NORM = trace(lambda x, w: F.rms_norm(x, w), ("x", "f32", ("a", "c")), ("w", "f32", ("c",)))
RESIDUAL_NORM = trace(lambda x, r, w, b: F.layer_norm(x + r, w, b),
                      ("x", "f32", ("a", "c")), ("r", "f32", ("a", "c")), ("w", "f32", ("c",)),
                      ("b", "f32", ("c",)))


def layer_norm(x, w, b, axes, terms=None):
    """(x - mean) * rstd * w + b over `axes`, and the size of the terms each element carries:
    x and its mean (|terms| when x is itself a sum), scaled by rstd and w, and b."""
    x, w, b = f64(x), f64(w), f64(b)
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + f32(1e-5))
    size = np.abs(x) if terms is None else terms
    return (x - mean) * rstd * w + b, (size + np.abs(x).mean(axis=axes, keepdims=True)) \
        * rstd * np.abs(w) + np.abs(b)


def rms_norm(x, w):
    x = f64(x)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + f32(1e-6)) * f64(w)


@EXAMPLES
@given(a=SIZES, b=SIZES, c=SIZES, seed=st.integers(0, 2**16))
def test_norms(a, b, c, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, (a, c), scale=2) + 3
    w, bias = rand(rng, (c,)), rand(rng, (c,))
    want, scale = layer_norm(x, w, bias, (1,))
    check(LAYER_NORM, x, w, bias, want=[want], reduced=c, scale=scale)
    check(RMS_NORM, x, w, want=[rms_norm(x, w)], reduced=c)
    r = rand(rng, (a, c))
    want, scale = layer_norm(f64(x) + f64(r), w, bias, (1,), terms=np.abs(x) + np.abs(r))
    check(RESIDUAL_NORM, x, r, w, bias, want=[want], reduced=c, scale=scale)
    x3, w2, b2 = rand(rng, (a, b, c)), rand(rng, (b, c)), rand(rng, (b, c))
    want, scale = layer_norm(x3, w2, b2, (1, 2))
    check(LAYER_NORM_2D, x3, w2, b2, want=[want], reduced=b * c, scale=scale)


@pytest.mark.parametrize("shape", [(0, 8), (3, 0, 8), (0, 0, 8)])
def test_norms_of_empty_tensors(shape):
    """NumPy gives an empty array all-0 strides; read as strides, they made the rows look
    broadcast and the kernel touched the weights outside the loop over them."""
    rng = np.random.default_rng(6)
    x, w, bias = rand(rng, shape), rand(rng, (8,)), rand(rng, (8,))
    group = trace(lambda v, g, h: F.layer_norm(v, g, h), ("x", "f32", shape),
                  ("w", "f32", (8,)), ("b", "f32", (8,)))
    check(group, x, w, bias, want=[f64(x)], reduced=8)
    assert "for r" in compile_group(group["main"]).kernel_text()
    sums = trace(lambda v: F.sum(v, axis=-1) * 2.0, ("x", "f32", (*shape[:-1], 0)))
    y = rand(rng, (*shape[:-1], 0))
    check(sums, y, want=[np.zeros(shape[:-1])])


def test_reductions_over_dims_of_size_one():
    """A dim a reduction keeps (size 1) reduced again is a copy, not a second set of axes."""
    rng = np.random.default_rng(7)
    x = rand(rng, (6, 9))
    group = trace(lambda a: F.max(F.sum(a, axis=1, keepdims=True), axis=1) * 2.0,
                  ("x", "f32", (6, 9)))
    check(group, x, want=[2 * f64(x).sum(1)], reduced=9)
    y = rand(rng, (1, 1, 7))
    group = trace(lambda a: a - F.mean(F.sum(a, axis=(0, 2), keepdims=True), axis=(0, 1, 2),
                                       keepdims=True), ("y", "f32", (1, 1, 7)))
    check(group, y, want=[f64(y) - f64(y).sum()], reduced=7)


# --- dtypes, targets, threads -----------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_low_precision_inputs_and_outputs(dtype):
    rng = np.random.default_rng(1)
    npdt = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    up = trace(lambda x: F.softmax(x.astype("f32"), axis=-1), ("x", dtype, (7, 45)))
    x = rand(rng, (7, 45), npdt)
    check(up, x, want=[softmax(f64(x), -1)], reduced=45)
    same = trace(lambda x, w: F.rms_norm(x, w), ("x", dtype, (5, 77)), ("w", dtype, (77,)))
    x, w = rand(rng, (5, 77), npdt), rand(rng, (77,), npdt)
    check(same, x, w, want=[rms_norm(x, w)], dtype=dtype, reduced=77)


def test_where_with_bool_mask():
    rng = np.random.default_rng(2)
    group = trace(lambda s, m: F.softmax(F.where(m, s, -1e9), axis=-1),
                  ("s", "f32", (3, 21)), ("m", "bool", (1, 21)))
    s, m = rand(rng, (3, 21)), rng.random((1, 21)) > 0.3
    check(group, s, m, want=[softmax(np.where(m, f64(s), -1e9), -1)], reduced=21)


@pytest.mark.parametrize("key", ["softmax2", "softmax0", "mean_var"])
def test_avx2_target(key):
    target = named_target("x86-64-v3")
    if not target.is_host():
        pytest.skip("x86-64-v3 code cannot run here")
    check_norm(key, rand(np.random.default_rng(3), (5, 9, 37)), target=target)
    rng = np.random.default_rng(4)
    x, w, b = rand(rng, (13, 101)), rand(rng, (101,)), rand(rng, (101,))
    want, scale = layer_norm(x, w, b, (1,))
    check(LAYER_NORM, x, w, b, want=[want], reduced=101, scale=scale, target=target)


def test_parallel_rows_and_columns():
    """Big enough to run on every thread: rows split for softmax, columns for axis 0."""
    rng = np.random.default_rng(5)
    x = rand(rng, (96, 1031), scale=4)
    check_norm("softmax2", x[None])
    check_norm("softmax0", x[:, :, None].repeat(1, 2))
    elementwise = trace(lambda v: F.silu(v) * 2.0, ("v", "f32", ("n",)))
    v = rand(rng, (200_003,))
    check(elementwise, v, want=[2 * f64(v) * sigmoid(f64(v))])


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
    assert_close(out, rms_norm(x, w), dtype="f32", reduced=40)
    with pytest.raises(ShapeError, match="C-contiguous"):
        fn(x, w, out=[np.empty((40, 6), np.float32).T])
