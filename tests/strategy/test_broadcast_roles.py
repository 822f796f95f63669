"""Compiled graphs whose operands broadcast in every role, against float64 NumPy.

A GEMM epilogue or a memory-bound kernel reads each operand as a full tile, a row shared by all
rows, one value per row or one value: the role comes from the IR's broadcasting, so shapes that
coincide (M == N, N == K, dims of 1 and 0) must not change the answer. Each case also checks
that a native method won (the test cannot pass through the extern fallback) and that every
candidate the selector could pick, extern included, computes the same thing.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tilefold
from tests.tolerances import tolerance
from tilefold.ir import Builder
from tilefold.ir import functional as F

RNG = np.random.default_rng(2024)
ERF = np.vectorize(math.erf, otypes=[np.float64])


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


def compiled(build, *arrays: np.ndarray):
    """`build(builder, *args)` over arguments shaped like `arrays`, compiled."""
    b = Builder("main")
    args = [b.arg(f"a{i}", "f32", a.shape) for i, a in enumerate(arrays)]
    return tilefold.compile(b.build(build(b, *args)))


def assert_close(got: np.ndarray, want: np.ndarray, reduced: int, scale: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(f64(got), want, **tolerance("f32", reduced, scale))


def every_candidate_agrees(graph, arrays, want, reduced: int, scale: float) -> None:
    """Build and run every candidate of a one-group graph on the graph's own inputs."""
    (decision,) = graph.decisions(*(a.shape for a in arrays))
    problem, fn = decision.problem, graph.function
    inputs = [problem.constants[inner] if inner in problem.constants
              else arrays[fn.args.index(outer)]
              for inner, outer in zip(problem.inputs, problem.op.operands, strict=True)]
    for c in decision.candidates:
        (out,) = [np.full(t.shape, np.nan, np.float32) for t in problem.out_types()]
        kernel = c.build()
        kernel.run(*inputs, out, *kernel.scratch_arrays())
        assert_close(out, want, reduced, scale)


def check(build, arrays, want, methods, reduced: int = 1, scale: float = 1.0) -> None:
    """Compile, compare with `want`, require `methods` (one per group) to have won."""
    graph = compiled(build, *arrays)
    (got,) = graph(*arrays)
    assert_close(got, want, reduced, scale)
    won = [d.winner.method for d in graph.decisions(*(a.shape for a in arrays))]
    assert won == list(methods), won
    if len(won) == 1:
        every_candidate_agrees(graph, arrays, want, reduced, scale)


# --- GEMM epilogues ---------------------------------------------------------------------
def _gelu(x):
    return 0.5 * x * (1 + ERF(x / math.sqrt(2)))


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True, initial=-np.inf))
    return e / e.sum(axis, keepdims=True)


def _mean(x, axis):
    """NumPy's mean, quietly NaN over an empty axis (0 / 0)."""
    with np.errstate(invalid="ignore"):
        return x.sum(axis, keepdims=True) / x.shape[axis]


def _layer_norm(x, w, b, eps=1e-5):
    d = x - _mean(x, -1)
    return d / np.sqrt(_mean(d * d, -1) + eps) * w + b


# name: (extra operand shapes given (m, n), graph of (builder, C, *extras), NumPy of the same).
# An extra named "c*" is a constant in the graph, any other an argument.
EPILOGUES = {
    "bias[N] constant": (lambda m, n: {"c_b": (n,)}, lambda b, c, bb: c + bb,
                         lambda c, bb: c + bb),
    "bias[N] argument": (lambda m, n: {"b": (n,)}, lambda b, c, bb: c + bb,
                         lambda c, bb: c + bb),
    "bias[M,1] argument": (lambda m, n: {"b": (m, 1)}, lambda b, c, bb: c + bb,
                           lambda c, bb: c + bb),
    "bias[1,N] constant": (lambda m, n: {"c_b": (1, n)}, lambda b, c, bb: c + bb,
                           lambda c, bb: c + bb),
    "scalar constant": (lambda m, n: {"c_s": ()}, lambda b, c, s: c * s, lambda c, s: c * s),
    "residual[M,N]": (lambda m, n: {"r": (m, n)}, lambda b, c, r: c - r, lambda c, r: c - r),
    "relu(C * 0.5 + bias[N])": (
        lambda m, n: {"c_b": (n,)}, lambda b, c, bb: F.relu(c * 0.5 + bb),
        lambda c, bb: np.maximum(c * 0.5 + bb, 0)),
    "gelu(C + bias[M,1])": (
        lambda m, n: {"b": (m, 1)}, lambda b, c, bb: F.gelu(c + bb), lambda c, bb: _gelu(c + bb)),
    "silu(C) * bias[N]": (
        lambda m, n: {"b": (n,)}, lambda b, c, bb: F.silu(c) * bb,
        lambda c, bb: c / (1 + np.exp(-c)) * bb),
    "softmax(C + bias[N])": (
        lambda m, n: {"c_b": (n,)}, lambda b, c, bb: F.softmax(c + bb),
        lambda c, bb: _softmax(c + bb)),
    "layer_norm(C, w[N], b[N])": (
        lambda m, n: {"c_w": (n,), "c_b": (n,)}, lambda b, c, w, bb: F.layer_norm(c, w, bb),
        _layer_norm),
    "C - max(C, keepdims)": (
        lambda m, n: {}, lambda b, c: c - F.max(c, -1, keepdims=True),
        lambda c: c - c.max(-1, keepdims=True)),
    "row sums [M] + v[M]": (  # a keepdims=false reduction: one value per row, by semantics
        lambda m, n: {"v": (m,)}, lambda b, c, v: F.sum(c, -1) + v,
        lambda c, v: c.sum(-1) + v),
}
# (M, N, K): square, M == N != K, primes, dims of 1, K = 0 (C is zeros) and empty C.
GEMM_SHAPES = [(8, 8, 8), (12, 12, 5), (13, 13, 13), (7, 5, 3), (1, 1, 1), (1, 6, 6),
               (6, 1, 6), (6, 6, 1), (5, 5, 0), (5, 3, 0), (0, 4, 4), (4, 0, 4)]
GEMM_CASES = [pytest.param(name, shape, id=f"{name}-{'x'.join(map(str, shape))}")
              for name in EPILOGUES for shape in GEMM_SHAPES
              if not (name == "C - max(C, keepdims)" and shape[1] == 0)]  # max of no elements


def _gemm_case(name: str, a_shape, w_shape, w_constant: bool):
    """(build, argument arrays, want, reduced, scale) for C = A @ W and epilogue `name`."""
    extras, graph_fn, numpy_fn = EPILOGUES[name]
    m, k, n = a_shape[-2], a_shape[-1], w_shape[-1]
    shapes = extras(m, n)
    a, w = rand(*a_shape), rand(*w_shape)
    values = {key: rand(*s) for key, s in shapes.items()}
    args = [a] + ([] if w_constant else [w]) + [v for key, v in values.items()
                                                if not key.startswith("c_")]

    def build(b, x, *rest):
        weight = b.constant(w) if w_constant else rest[0]
        rest = list(rest[0 if w_constant else 1:])
        ops = [b.constant(v) if key.startswith("c_") else rest.pop(0)
               for key, v in values.items()]
        return graph_fn(b, x @ weight, *ops)

    want = numpy_fn(f64(a) @ f64(w), *(f64(v) for v in values.values()))
    scale = float(np.max(np.abs(f64(a)) @ np.abs(f64(w)), initial=1.0)) + 4.0
    return build, args, want, k + n, scale


@pytest.mark.parametrize(("name", "shape"), GEMM_CASES)
def test_gemm_epilogue_roles(name, shape):
    m, n, k = shape
    build, args, want, reduced, scale = _gemm_case(name, (m, k), (k, n), w_constant=True)
    check(build, args, want, ["blocks.gemm"], reduced, scale)


BATCHED_BIASES = [lambda b, m, n: (n,), lambda b, m, n: (1, 1, n), lambda b, m, n: (b, 1, n),
                  lambda b, m, n: (m, n), lambda b, m, n: (b, m, 1), lambda b, m, n: (b, 1, 1),
                  lambda b, m, n: (1, m, n), lambda b, m, n: (b, m, n)]
BATCHED_SHAPES = [(3, 4, 4, 4), (2, 5, 5, 3), (4, 3, 3, 0), (3, 1, 4, 2), (2, 3, 1, 3)]


@pytest.mark.parametrize("shape", BATCHED_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("weights", ["shared", "batched"])
def test_batched_gemm_bias_roles(weights, shape):
    """(B,M,K) @ (K,N) or (B,K,N), plus a bias in each broadcast role of (B,M,N)."""
    bs, m, n, k = shape
    a = rand(bs, m, k)
    w = rand(k, n) if weights == "shared" else rand(bs, k, n)
    scale = float(np.max(np.abs(f64(a)) @ np.abs(f64(w)), initial=1.0)) + 4.0
    for bias_shape in BATCHED_BIASES:
        bias = rand(*bias_shape(bs, m, n))
        check(lambda b, x, y, z: F.relu(x @ y + z), [a, w, bias],
              np.maximum(f64(a) @ f64(w) + f64(bias), 0), ["blocks.gemm"], k, scale)


def test_batched_softmax_and_layer_norm_epilogues():
    a, w, mask = rand(3, 6, 6), rand(3, 6, 6), rand(3, 1, 6)
    c = f64(a) @ f64(w)
    check(lambda b, x, y, z: F.softmax(x @ y * 0.25 + z), [a, w, mask],
          _softmax(c * 0.25 + mask), ["blocks.gemm"], 12, 40.0)
    g, h = rand(6), rand(6)
    check(lambda b, x, y: F.layer_norm(x @ y, b.constant(g), b.constant(h)), [a, w],
          _layer_norm(c, g, h), ["blocks.gemm"], 12)


@pytest.mark.parametrize("n", [8, 5])
def test_keepdims_false_reduction_broadcast_along_the_rows(n):
    """C - max(C, -1) without keepdims: NumPy lines the [N] maxima up with C's columns, so
    element (i, j) subtracts the maximum of row j; no row program computes that, so fusion
    leaves the sub out of the GEMM's group (which keeps its row max) instead of sending the
    whole GEMM to extern."""
    a, w = rand(n, 3), rand(3, n)
    c = f64(a) @ f64(w)
    check(lambda b, x, y: (lambda t: t - F.max(t, -1))(x @ y), [a, w], c - c.max(-1),
          ["blocks.gemm", "autocodegen.kernel"], 3 + n, 10.0)


# --- matrix-vector products and K = 0 ---------------------------------------------------
@pytest.mark.parametrize(("a_shape", "b_shape", "method"), [
    ((9, 7), (7, 1), "blocks.gemm"),      # N = 1: the GEMV plan takes B as its vector
    ((1, 7), (7, 9), "blocks.gemm"),      # M = 1
    ((9, 7), (7,), "lto.rowlib"),
    ((5, 0), (0, 10), "blocks.gemm"),
    ((5, 5, 0), (0, 5), "blocks.gemm"),
    ((5, 0), (0, 1), "blocks.gemm"),
    ((5, 0), (0,), "lto.rowlib"),
    ((7,), (7, 9), "blocks.gemm"),        # vector @ matrix: A is a [1, K] row (was extern)
    ((7,), (3, 7, 9), "blocks.gemm"),
    ((7,), (7,), "blocks.gemm"),          # a dot product: C is 0-d
])
def test_matrix_vector_products_and_empty_sums(a_shape, b_shape, method):
    a, b = rand(*a_shape), rand(*b_shape)
    want = f64(a) @ f64(b)
    check(lambda _, x, y: x @ y, [a, b], want, [method], a_shape[-1])
    if len(b_shape) == 2:
        bias = rand(b_shape[-1])
        check(lambda _, x, y, z: x @ y + z, [a, b, bias], want + bias, [method],
              a_shape[-1])


@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ((9, 7), (7,)), ((7,), (7, 9)), ((2, 9, 7), (7,)), ((7,), (2, 7, 9)), ((7,), (7,)),
    ((5, 0), (0,)), ((0,), (0, 4)),
])
def test_gemv_epilogues(a_shape, b_shape):
    """A 1-D operand is a [1, K] row of A or a [K, 1] column of B, and the epilogue runs on C's
    own shape (a dot product's: one row of one value); no method took these before."""
    a, b, s = rand(*a_shape), rand(*b_shape), np.array(0.7, np.float32)
    want = np.log(np.abs(f64(a) @ f64(b)) + 1.0) * 0.7
    check(lambda _, x, y, z: F.log(F.abs(x @ y) + 1.0) * z, [a, b, s], want, ["blocks.gemm"],
          a_shape[-1], 4.0)


@pytest.mark.parametrize("shape", [(8, 8, 8), (5, 13, 3), (1, 9, 4)],
                         ids=lambda s: "x".join(map(str, s)))
def test_epilogue_casts_and_masks_are_exact(shape):
    """Round trips through f16/bf16 and where(C > bias, C, r) in a GEMM's epilogue (they sent
    the whole GEMM to NumPy). Integer operands make C exact, so the f32 add and each rounding
    to nearest even are reproduced bit for bit."""
    m, n, k = shape
    a = RNG.integers(-4, 5, (m, k)).astype(np.float32)
    w = RNG.integers(-4, 5, (k, n)).astype(np.float32)
    bias, r = rand(n), rand(m, n)
    c = a @ w  # exact
    for dtype, np_dtype in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16)):
        graph = compiled(lambda _, x, y, z, t=dtype: F.cast(F.cast(x @ y + z, t), "f32"), a, w,
                         bias)
        np.testing.assert_array_equal(graph(a, w, bias)[0],
                                      (c + bias).astype(np_dtype).astype(np.float32))
        assert [d.winner.method for d in graph.decisions(a.shape, w.shape, bias.shape)] == [
            "blocks.gemm"]
    graph = compiled(lambda _, x, y, z, q: F.where(x @ y > z, x @ y, q), a, w, bias, r)
    np.testing.assert_array_equal(graph(a, w, bias, r)[0], np.where(c > bias, c, r))
    assert [d.winner.method for d in graph.decisions(a.shape, w.shape, bias.shape, r.shape)
            ] == ["blocks.gemm"]


@pytest.mark.parametrize("shape", [(8, 8, 8), (5, 13, 3), (17, 33, 7)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("role", ["tile", "row"])
def test_epilogue_reads_and_writes_bool_masks(shape, role):
    """A bool mask read by a GEMM's epilogue (a causal mask after a linear layer, as a tile or
    a row shared by all rows) and a bool result: both ran the GEMM on NumPy ("in memory a row
    program's values are f32/..."). Integer operands make C exact."""
    m, n, k = shape
    a = RNG.integers(-4, 5, (m, k)).astype(np.float32)
    w = RNG.integers(-4, 5, (k, n)).astype(np.float32)
    mask = RNG.random((m, n) if role == "tile" else (n,)) < 0.5
    b = Builder("main")
    x, y = b.arg("x", "f32", a.shape), b.arg("y", "f32", w.shape)
    keep = b.arg("keep", "bool", mask.shape)
    c = x @ y
    graph = tilefold.compile(b.build(F.where(keep, c, 0.0), F.greater(c, 0.0)))
    got, positive = graph(a, w, mask)
    np.testing.assert_array_equal(got, np.where(mask, a @ w, 0.0))
    np.testing.assert_array_equal(positive, a @ w > 0)
    assert [d.winner.method for d in graph.decisions(a.shape, w.shape, mask.shape)] == [
        "blocks.gemm"]


# --- memory-bound groups ----------------------------------------------------------------
NATIVE = {"autocodegen.kernel", "handwritten.softmax", "lto.rowlib"}
ROW = rand(16)
MEMORY = {
    "x + v[N]": (lambda m, n: [(m, n), (n,)], lambda b, x, v: x + v, lambda x, v: x + v),
    "x * v[N] constant": (lambda m, n: [(m, n)], lambda b, x: x * b.constant(ROW[:x.shape[1]]),
                          lambda x: x * ROW[:x.shape[1]]),
    "c[M,1] + v[N]": (lambda m, n: [(m, 1), (n,)], lambda b, c, v: c + v, lambda c, v: c + v),
    "x - max(x, 1, keepdims)": (lambda m, n: [(m, n)], lambda b, x: x - F.max(x, 1, True),
                                lambda x: x - x.max(1, keepdims=True)),
    "x - max(x, 0, keepdims)": (lambda m, n: [(m, n)], lambda b, x: x - F.max(x, 0, True),
                                lambda x: x - x.max(0, keepdims=True)),
    "x - max(x, 0)": (lambda m, n: [(m, n)], lambda b, x: x - F.max(x, 0),
                      lambda x: x - x.max(0)),
    "sum(x, 1) + v[M]": (lambda m, n: [(m, n), (m,)], lambda b, x, v: F.sum(x, 1) + v,
                         lambda x, v: x.sum(1) + v),
    "sum(x, 0) + v[N]": (lambda m, n: [(m, n), (n,)], lambda b, x, v: F.sum(x, 0) + v,
                         lambda x, v: x.sum(0) + v),
    "mean(x, 0)": (lambda m, n: [(m, n)], lambda b, x: F.mean(x, 0), lambda x: x.mean(0)),
    "mean(x, 1)": (lambda m, n: [(m, n)], lambda b, x: F.mean(x, 1), lambda x: x.mean(1)),
    "softmax(x, 0)": (lambda m, n: [(m, n)], lambda b, x: F.softmax(x, 0),
                      lambda x: _softmax(x, 0)),
    "softmax(x, 1)": (lambda m, n: [(m, n)], lambda b, x: F.softmax(x, 1),
                      lambda x: _softmax(x, 1)),
    "layer_norm(x, w[N], b[N])": (
        lambda m, n: [(m, n), (n,), (n,)], lambda b, x, w, c: F.layer_norm(x, w, c),
        _layer_norm),
}


@pytest.mark.parametrize("shape", [(8, 8), (7, 7), (1, 1), (6, 3), (3, 6)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(MEMORY))
def test_memory_bound_roles(name, shape):
    shapes, graph_fn, numpy_fn = MEMORY[name]
    arrays = [rand(*s) for s in shapes(*shape)]
    graph = compiled(graph_fn, *arrays)
    want = numpy_fn(*map(f64, arrays))
    assert_close(graph(*arrays)[0], want, max(shape), 4.0)
    (decision,) = graph.decisions(*(a.shape for a in arrays))
    assert decision.winner.method in NATIVE, decision.winner.key
    every_candidate_agrees(graph, arrays, want, max(shape), 4.0)


@pytest.mark.parametrize("n", [8, 7])
def test_reduction_without_keepdims_expanded_back(n):
    """max(x, 1) -> expand_dims -> x - it: the per-row role comes through the layout op."""
    x = rand(n, n)
    check(lambda b, t: t - F.expand_dims(F.max(t, 1), 1), [x],
          f64(x) - f64(x).max(1, keepdims=True), ["autocodegen.kernel", "autocodegen.kernel"])


def test_empty_rows():
    x = rand(0, 8)
    check(lambda b, t: F.softmax(t), [x], f64(x), ["handwritten.softmax"])
    y = rand(5, 0)
    check(lambda b, t: F.mean(t, 1), [y], _mean(f64(y), 1)[:, 0], ["autocodegen.kernel"])


# --- tuning -----------------------------------------------------------------------------
def test_tuning_runs_native_candidates_with_0d_constants(monkeypatch):
    """A 0-d constant input reaches every timed candidate as a 0-d array (a [1] copy made each
    native candidate fail its shape check, and extern won unnoticed)."""
    monkeypatch.setenv("TILEFOLD_TUNE", "0.2")
    half = np.array(0.5, np.float32)
    x, w = rand(32, 48), rand(48, 40)
    graphs = [
        (lambda b, t: F.exp(t * b.constant(half)), [rand(64, 64)],
         "autocodegen.kernel{}"),
        (lambda b, t: F.relu(t @ b.constant(w) * b.constant(half)), [x],
         'blocks.gemm{"epilogue":true,"prepack":true}'),
    ]
    for build, arrays, native in graphs:
        graph = compiled(build, *arrays)
        graph(*arrays)
        (decision,) = graph.decisions(*(a.shape for a in arrays))
        assert decision.failures == {}, decision.failures
        assert native in decision.measured, decision.measured


@pytest.mark.parametrize("m", [6, 1, 0])
def test_symbolic_rows_meeting_n(m):
    """x: f32[?m, 6] @ W[6, 6]: when ?m binds to N, the [N] bias still runs along the rows and
    the [?m] vector still holds one value per row."""
    w, bias = rand(6, 6), rand(6)
    b = Builder("main")
    x, v = b.arg("x", "f32", ("m", 6)), b.arg("v", "f32", ("m",))
    c = x @ b.constant(w) + b.constant(bias)
    graph = tilefold.compile(b.build(c, F.sum(c, -1) + v))
    xs, vs = rand(m, 6), rand(m)
    want = f64(xs) @ f64(w) + bias
    got, sums = graph(xs, vs)
    scale = float(np.max(np.abs(f64(xs)) @ np.abs(f64(w)), initial=1.0)) + 4.0
    assert_close(got, want, 12, scale)
    assert_close(sums, want.sum(-1) + vs, 12, 6 * scale)
    assert [d.winner.method for d in graph.decisions(xs.shape, vs.shape)] == ["blocks.gemm"]
