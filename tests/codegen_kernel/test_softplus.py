"""softplus, the op added end to end through the lowering table (IR op, rule, ATen rule):
native kernels against float64 NumPy within a stated ULP bound, large |x| included.

Bound: the rule computes max(z, 0) + log1p(e**-|z|) for z = beta*x, log1p by Goldberg's
trick. Against log(1 + e**z) / beta of the f32 z, it is within 3 ULP for beta = 1 (measured
2.8 over 4M inputs across [-100, 100] and every exponent) and 4 ULP otherwise (3.4 measured;
one more rounding, the division by beta). z itself is rounded like PyTorch's f32 beta*x, an
error e**z magnifies by |z| where beta is not a power of two."""

from __future__ import annotations

import numpy as np
import pytest

import tilefold
from tilefold.ir import Builder, interpret, parse_module
from tilefold.passes import PassManager
from tilefold.strategy import METHODS, Problem, context, register_builtin_methods

RNG = np.random.default_rng(1515)
ULP = {1.0: 3.0, "other": 4.0}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 19.999998, 20.0, 20.000002, -20.0, -87.3,
           -88.8, -103.0, -104.0, -150.0, 1e-30, -1e-30, 3e38, -3e38, 1.0, -1.0]


def inputs(n: int = 1 << 15) -> np.ndarray:
    """Random x of every magnitude: normal, wide uniform, and log-uniform of both signs."""
    parts = [RNG.standard_normal(n) * 4, RNG.uniform(-110, 110, n),
             np.sign(RNG.standard_normal(n)) * np.exp2(RNG.uniform(-40, 8, n)), SPECIAL]
    return np.concatenate(parts).astype(np.float32)


def softplus64(x: np.ndarray, beta: float, threshold: float) -> np.ndarray:
    """The oracle: log(1 + e**z) / beta in float64 for z = beta*x rounded to f32."""
    with np.errstate(all="ignore"):
        z = (x * np.float32(beta)).astype(np.float64)
        return np.where(z > threshold, x.astype(np.float64), np.logaddexp(0.0, z) / beta)


def assert_ulp(got: np.ndarray, want: np.ndarray, bound: float) -> None:
    """|got - want| within `bound` ULPs of want's f32 rounding; NaN meets NaN, inf meets inf."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    got, want = got[~nan].astype(np.float64), want[~nan]
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf])
    spacing = np.spacing(np.abs(want[~inf]).astype(np.float32)).astype(np.float64)
    ulps = np.abs(got[~inf] - want[~inf]) / spacing
    worst = int(np.argmax(ulps))
    assert ulps[worst] <= bound, (
        f"{ulps[worst]:.2f} ULP at want={want[~inf][worst]!r}, got={got[~inf][worst]!r}")


@pytest.mark.parametrize(("beta", "threshold"), [(1.0, 20.0), (2.0, 20.0), (0.5, 5.0),
                                                 (3.0, 1e9), (1.0, -1.0)])
def test_memory_bound_kernel_within_ulp_bound(beta, threshold):
    x = inputs()
    b = Builder("main")
    y = b.op("softplus", b.arg("x", "f32", x.shape), beta=beta, threshold=threshold)
    graph = tilefold.compile(b.build(y), strict=True)
    (got,) = graph(x)
    (decision,) = graph.decisions(x.shape)
    assert decision.winner.method == "autocodegen.kernel"
    assert_ulp(got, softplus64(x, beta, threshold), ULP.get(beta, ULP["other"]))


def test_reference_interpreter_is_the_float64_formula():
    x = inputs(1 << 10)
    text = f"""func @main(%x: f32[{x.size}]) -> (f32[{x.size}]) {{
      %0 = softplus(%x) {{beta = 2.0, threshold = 3.0}} : f32[{x.size}]
      return(%0)
    }}"""
    (got,) = interpret(parse_module(text), x)
    assert_ulp(got, softplus64(x, 2.0, 3.0), 0.5)  # rounded once from float64


def test_gemm_epilogue_within_ulp_bound():
    """softplus(x @ w + b) as a row program over C; quarter-integer inputs keep C exact."""
    register_builtin_methods()
    x = (RNG.integers(-40, 41, (6, 16)) / 4).astype(np.float32)
    w = (RNG.integers(-8, 9, (16, 40)) / 4).astype(np.float32)
    bias = (RNG.integers(-400, 401, 40) / 4).astype(np.float32)
    text = """func @main(%x: f32[6,16], %w: f32[16,40], %b: f32[40]) -> (f32[6,40]) {
      %0 = matmul(%x, %w) : f32[6,40]
      %1 = add(%0, %b) : f32[6,40]
      %2 = softplus(%1) : f32[6,40]
      return(%2)
    }"""
    module = parse_module(text)
    PassManager("fusion").run(module)
    (op,) = [o for o in module["main"].ops if o.name == "fused"]
    problem = Problem.of(op, [x.shape, w.shape, bias.shape])
    (candidate,) = METHODS["blocks.gemm"].propose(problem, context())
    out = np.full((6, 40), np.nan, np.float32)
    kernel = candidate.build()
    kernel.run(x, w, bias, out, *kernel.scratch_arrays())
    c = x.astype(np.float64) @ w.astype(np.float64) + bias
    assert np.abs(c).max() > 60  # large |x| reach the epilogue too
    assert_ulp(out, softplus64(c.astype(np.float32), 1.0, 20.0), ULP[1.0])
