"""bf16, f16 and 8-bit GEMM groups with epilogues through blocks.gemm, against float64 NumPy.

The GEMM runs as `quant.api.matmul_lowp` (a constant B prepacked), its f32 or i32 sums feed the
row program, which writes each output in its IR dtype. The oracle rounds where the IR does:
every bf16/f16 op's result (C included) to its dtype; integer results are compared exactly.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tilefold
from tests.tolerances import assert_close
from tilefold.ir import Builder
from tilefold.ir import functional as F

RNG = np.random.default_rng(515)
ERF = np.vectorize(math.erf, otypes=[np.float64])
NP = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32, "u8": np.uint8,
      "i8": np.int8, "i32": np.int32}
# name: (A dtype, B dtype, C dtype)
KINDS = {"bf16": ("bf16", "bf16", "bf16"), "f16": ("f16", "f16", "f16"),
         "u8s8": ("u8", "i8", "i32"), "s8s8": ("i8", "i8", "i32")}
LIMITS = {"u8": (0, 255), "i8": (-128, 127)}


def draw(dtype: str, shape, extremes: bool = False) -> np.ndarray:
    """Random values of `dtype`; 8-bit operands only at their two limits when `extremes`."""
    if dtype in LIMITS:
        lo, hi = LIMITS[dtype]
        if extremes:
            return RNG.choice(np.array([lo, hi]), shape).astype(NP[dtype])
        return RNG.integers(lo, hi + 1, shape).astype(NP[dtype])
    if dtype == "i32":
        return RNG.integers(-(2 ** 30), 2 ** 30, shape).astype(np.int32)  # beyond f32's 2**24
    return RNG.standard_normal(shape).astype(NP[dtype])


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` (float64 or int64) as a `dtype` result, back in float64 (int64 for integers)."""
    if dtype == "i32":
        return x.astype(np.int64).astype(np.int32).astype(np.int64)  # wraps, as the IR does
    return x.astype(np.float32).astype(NP[dtype]).astype(np.float64)


def _gelu(x):
    return 0.5 * x * (1 + ERF(x / math.sqrt(2)))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# name: (extra operands' dtype and shape given (C dtype, m, n), graph of (C, *extras), oracle of
# (C, *extras, r) where r rounds to C's dtype). An extra named "c_*" is a constant.
EPILOGUES = {
    "none": (lambda dt, m, n: {}, lambda c: c, lambda c, r: c),
    "bias[N]": (lambda dt, m, n: {"b": (dt, (n,))}, lambda c, bb: c + bb,
                lambda c, bb, r: r(c + bb)),
    "bias[N] constant": (lambda dt, m, n: {"c_b": (dt, (n,))}, lambda c, bb: c + bb,
                         lambda c, bb, r: r(c + bb)),
    "bias[M,1]": (lambda dt, m, n: {"b": (dt, (m, 1))}, lambda c, bb: c + bb,
                  lambda c, bb, r: r(c + bb)),
    "relu(C + bias[N])": (lambda dt, m, n: {"b": (dt, (n,))}, lambda c, bb: F.relu(c + bb),
                          lambda c, bb, r: np.maximum(r(c + bb), 0)),
    "residual C - R[M,N]": (lambda dt, m, n: {"r": (dt, (m, n))}, lambda c, x: c - x,
                            lambda c, x, r: r(c - x)),
}
FLOAT_EPILOGUES = {
    "gelu(C + bias[N])": (lambda dt, m, n: {"b": (dt, (n,))}, lambda c, bb: F.gelu(c + bb),
                          lambda c, bb, r: r(_gelu(r(c + bb)))),
    "softmax(C + bias[N])": (lambda dt, m, n: {"c_b": (dt, (n,))},
                             lambda c, bb: F.softmax(c + bb),
                             lambda c, bb, r: r(_softmax(r(c + bb)))),
}
# (M, N, K) with how B is given: M == N, primes and K tails, M == 1, K == 1, N tails.
SHAPES = [((8, 8, 8), "constant [N,K]"), ((5, 19, 37), "argument [K,N]"),
          ((1, 24, 13), "argument [N,K]"), ((6, 6, 17), "constant [N,K]"),
          ((7, 3, 1), "constant [K,N]"), ((3, 33, 64), "argument [K,N]")]
EMPTY = [((4, 5, 0), "constant [N,K]"), ((0, 4, 4), "argument [K,N]")]
CASES = [pytest.param(kind, name, shape, b_mode,
                      id=f"{kind}-{name}-{'x'.join(map(str, shape))}-{b_mode}")
         for kind in KINDS
         for name in [*EPILOGUES, *(FLOAT_EPILOGUES if KINDS[kind][2] != "i32" else [])]
         for shape, b_mode in SHAPES + (EMPTY if name in ("none", "bias[N]") else [])]


def compiled_case(kind: str, name: str, shape, b_mode: str, extremes: bool = False):
    """(graph, argument arrays, oracle, C dtype, K, scale) for C = A @ B + epilogue `name`."""
    a_dt, b_dt, c_dt = KINDS[kind]
    (m, n, k), (extras, graph_fn, oracle) = shape, {**EPILOGUES, **FLOAT_EPILOGUES}[name]
    transposed = "[N,K]" in b_mode
    a = draw(a_dt, (m, k), extremes)
    w = draw(b_dt, (n, k) if transposed else (k, n), extremes)
    values = {key: draw(dt, s) for key, (dt, s) in extras(c_dt, m, n).items()}
    bld = Builder("main")
    x = bld.arg("a", a_dt, a.shape)
    args = [a]
    if b_mode.startswith("constant"):
        weight = bld.constant(w)
    else:
        weight = bld.arg("w", b_dt, w.shape)
        args.append(w)
    ops = []
    for key, v in values.items():
        if key.startswith("c_"):
            ops.append(bld.constant(v))
        else:
            ops.append(bld.arg(key, c_dt, v.shape))
            args.append(v)
    c = bld.op("matmul", x, weight, transpose_b=transposed)
    graph = tilefold.compile(bld.build(graph_fn(c, *ops)))
    wide = np.int64 if c_dt == "i32" else np.float64
    b64 = w.astype(wide).T if transposed else w.astype(wide)
    c64 = rounded(a.astype(wide) @ b64, c_dt)
    want = oracle(c64, *(v.astype(wide) for v in values.values()), lambda t: rounded(t, c_dt))
    scale = float(np.max(np.abs(a.astype(np.float64)) @ np.abs(b64.astype(np.float64)),
                         initial=1.0)) + 4.0
    return graph, args, want, c_dt, k, scale


def check_result(got: np.ndarray, want: np.ndarray, dtype: str, k: int, scale: float) -> None:
    assert got.dtype == NP[dtype], got.dtype
    if dtype == "i32":
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.astype(np.int64), want)
    else:
        assert_close(got, want, dtype=dtype, reduced=k + 1, scale=scale)


def winners(graph, args) -> list[str]:
    return [d.winner.method for d in graph.decisions(*(a.shape for a in args))]


def check(graph, args, wants, dtypes: list[str], k: int, scale: float) -> None:
    """The compiled graph's outputs, then blocks.gemm's kernel run alone on outputs filled
    with NaN (or i32's most negative value), so an output the kernel never writes fails, and
    that blocks.gemm won."""
    for got, want, dtype in zip(graph(*args), wants, dtypes, strict=True):
        check_result(got, want, dtype, k, scale)
    (decision,) = graph.decisions(*(a.shape for a in args))
    problem, fn = decision.problem, graph.function
    inputs = [problem.constants[inner] if inner in problem.constants
              else args[fn.args.index(outer)]
              for inner, outer in zip(problem.inputs, problem.op.operands, strict=True)]
    outs = [np.full(t.shape, np.iinfo(np.int32).min if str(t.dtype) == "i32" else np.nan,
                    t.dtype.np_dtype) for t in problem.out_types()]
    (blocks,) = [c for c in decision.candidates if c.method == "blocks.gemm"]
    kernel = blocks.build()
    kernel.run(*inputs, *outs, *kernel.scratch_arrays())
    for got, want, dtype in zip(outs, wants, dtypes, strict=True):
        check_result(got, want, dtype, k, scale)
    assert decision.winner.method == "blocks.gemm", decision.winner.method


@pytest.mark.parametrize(("kind", "name", "shape", "b_mode"), CASES)
def test_lowp_gemm_epilogues(kind, name, shape, b_mode):
    graph, args, want, dtype, k, scale = compiled_case(kind, name, shape, b_mode)
    check(graph, args, [want], [dtype], k, scale)


@pytest.mark.parametrize("kind", KINDS)
def test_lowp_gemm_past_one_block(kind):
    """A GEMM of several register tiles and K blocks, its epilogue on both threads."""
    graph, args, want, dtype, k, scale = compiled_case(kind, "relu(C + bias[N])",
                                                       (131, 520, 301), "constant [N,K]")
    check(graph, args, [want], [dtype], k, scale)


@pytest.mark.parametrize("kind", ["u8s8", "s8s8"])
@pytest.mark.parametrize(("shape", "b_mode"), [((6, 6, 37), "constant [N,K]"),
                                               ((4, 17, 64), "argument [K,N]")])
def test_int8_operand_extremes_are_exact(kind, shape, b_mode):
    """A and B only at their limits (0/255, -128/127), i32 biases of about 2**30: exact."""
    graph, args, want, dtype, k, scale = compiled_case(kind, "relu(C + bias[N])", shape,
                                                       b_mode, extremes=True)
    check(graph, args, [want], [dtype], k, scale)


def test_dequantized_int8_gemm_to_f32():
    """cast(A @ B, f32) * scale[N] + bias[N]: the i32 sums converted in the row program."""
    a, w = draw("u8", (5, 29)), draw("i8", (29, 12))
    s, bias = draw("f32", (12,)) * 1e-3, draw("f32", (12,))
    bld = Builder("main")
    x, wt = bld.arg("a", "u8", a.shape), bld.constant(w)
    sv, bv = bld.arg("s", "f32", s.shape), bld.arg("b", "f32", bias.shape)
    graph = tilefold.compile(bld.build(F.cast(bld.op("matmul", x, wt), "f32") * sv + bv))
    c = (a.astype(np.int64) @ w.astype(np.int64)).astype(np.float64)
    want = c * s.astype(np.float64) + bias.astype(np.float64)
    check(graph, [a, s, bias], [want], ["f32"], 1, float(np.abs(want).max()) + 1)


@pytest.mark.parametrize("kind", ["bf16", "s8s8"])
def test_c_and_its_epilogue_both_outputs(kind):
    """C itself is an output beside relu(C + bias): both in C's dtype."""
    a_dt, b_dt, c_dt = KINDS[kind]
    a, w, bias = draw(a_dt, (7, 21)), draw(b_dt, (21, 10)), draw(c_dt, (10,))
    bld = Builder("main")
    x, wt, bv = bld.arg("a", a_dt, a.shape), bld.constant(w), bld.arg("b", c_dt, bias.shape)
    c = bld.op("matmul", x, wt)
    graph = tilefold.compile(bld.build(c, F.relu(c + bv)))
    wide = np.int64 if c_dt == "i32" else np.float64
    c64 = rounded(a.astype(wide) @ w.astype(wide), c_dt)
    scale = float(np.max(np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64)))) + 4.0
    want = np.maximum(rounded(c64 + bias.astype(wide), c_dt), 0)
    check(graph, [a, bias], [c64, want], [c_dt, c_dt], 21, scale)


def test_bf16_gemm_with_batched_a_and_vector_a():
    """A [2, 3, K] and A [K] against a 2-D constant B, each plus a bias."""
    w, bias = draw("bf16", (11, 9)), draw("bf16", (9,))
    for a_shape in [(2, 3, 11), (11,)]:
        a = draw("bf16", a_shape)
        bld = Builder("main")
        x, bv = bld.arg("a", "bf16", a.shape), bld.arg("b", "bf16", bias.shape)
        graph = tilefold.compile(bld.build(bld.op("matmul", x, bld.constant(w)) + bv))
        c64 = rounded(a.astype(np.float64) @ w.astype(np.float64), "bf16")
        want = rounded(c64 + bias.astype(np.float64), "bf16")
        check(graph, [a, bias], [want], ["bf16"], 11, 4.0 + float(np.abs(c64).max()))


def _rejection(graph, args) -> str:
    (decision,) = graph.decisions(*(a.shape for a in args))
    return next(r.reason for r in decision.rejections if r.method == "blocks.gemm")


def test_batched_b_is_refused_with_the_reason(allow_fallback):
    a, w = draw("bf16", (2, 3, 8)), draw("bf16", (2, 8, 5))
    bld = Builder("main")
    x, wt = bld.arg("a", "bf16", a.shape), bld.arg("w", "bf16", w.shape)
    graph = tilefold.compile(bld.build(F.relu(bld.op("matmul", x, wt))))
    (got,) = graph(a, w)
    want = np.maximum(rounded(a.astype(np.float64) @ w.astype(np.float64), "bf16"), 0)
    check_result(got, want, "bf16", 8, 4.0 + float(np.abs(want).max()))
    assert "2-D B" in _rejection(graph, [a, w])


def test_integer_division_epilogue_is_refused_with_the_reason(allow_fallback):
    a, w, d = draw("i8", (4, 6)), draw("i8", (6, 5)), RNG.integers(1, 9, (5,)).astype(np.int32)
    bld = Builder("main")
    x, wt, dv = bld.arg("a", "i8", a.shape), bld.constant(w), bld.arg("d", "i32", d.shape)
    graph = tilefold.compile(bld.build(bld.op("matmul", x, wt) / dv))
    (got,) = graph(a, d)
    c = a.astype(np.int64) @ w.astype(np.int64)
    np.testing.assert_array_equal(got, np.trunc(c / d).astype(np.int32))
    assert "'div' of i32 values is not in row programs" in _rejection(graph, [a, d])


def test_every_candidate_of_a_bf16_group_runs(allow_fallback):
    """Each candidate the selector could pick for a bf16 group (blocks.gemm refuses batched B)
    computes it; extern.torch crashed on bf16 arrays (torch.from_numpy has none) before it
    declined them."""
    a, w = draw("bf16", (2, 3, 8)), draw("bf16", (2, 8, 5))
    bld = Builder("main")
    x, wt = bld.arg("a", "bf16", a.shape), bld.arg("w", "bf16", w.shape)
    graph = tilefold.compile(bld.build(bld.op("matmul", x, wt)))
    (decision,) = graph.decisions(a.shape, w.shape)
    want = rounded(a.astype(np.float64) @ w.astype(np.float64), "bf16")
    assert decision.candidates
    for candidate in decision.candidates:
        out = np.full(want.shape, np.nan, ml_dtypes.bfloat16)
        kernel = candidate.build()
        kernel.run(a, w, out, *kernel.scratch_arrays())
        check_result(out, want, "bf16", 8, 4.0 + float(np.abs(want).max()))


def test_numpy_extern_charges_matmuls_without_blas():
    """NumPy multiplies bf16 (and integer) matrices in plain loops: extern.numpy's estimate
    charges those products at the reference's rate, so it no longer claims BLAS speed."""
    from tilefold.strategy.methods.extern import REFERENCE_FLOPS

    estimates = {}
    for dtype in ("f32", "bf16"):
        bld = Builder("main")
        x, wt = bld.arg("a", dtype, (4, 64, 64)), bld.arg("w", dtype, (4, 64, 64))
        graph = tilefold.compile(bld.build(bld.op("matmul", x, wt)))
        (decision,) = graph.decisions((4, 64, 64), (4, 64, 64))
        (numpy,) = [c for c in decision.candidates if c.method == "extern.numpy"]
        estimates[dtype] = numpy.estimate
    assert estimates["bf16"] - estimates["f32"] >= 0.99 * 2 * 4 * 64 ** 3 / REFERENCE_FLOPS


def test_f32_gemm_epilogue_writes_bf16():
    """An f32 GEMM whose epilogue ends in a bf16 cast: the row program stores bf16 itself (it
    took f32 arguments only)."""
    a, w, bias = draw("f32", (6, 23)), draw("f32", (23, 10)), draw("f32", (10,))
    bld = Builder("main")
    x, bv = bld.arg("a", "f32", a.shape), bld.arg("b", "f32", bias.shape)
    c = bld.op("matmul", x, bld.constant(w))
    graph = tilefold.compile(bld.build(F.cast(F.relu(c + bv), "bf16")))
    c64 = a.astype(np.float64) @ w.astype(np.float64)
    want = rounded(np.maximum(c64 + bias.astype(np.float64), 0), "bf16")
    check(graph, [a, bias], [want], ["bf16"], 23, 4.0 + float(np.abs(c64).max()))
