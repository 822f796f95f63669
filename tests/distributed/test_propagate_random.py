"""propagate-sharding + expand-redistribute on random chains with random input placements:
whatever the rules derive (or replicate), the simulated mesh, and the per-rank program that
spmd-partition makes of it, match float64 NumPy."""

from __future__ import annotations

from math import erf, sqrt

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.spmd_models import partitioned, run_spmd
from tilefold.distributed import simulate
from tilefold.ir import parse_module, verify
from tilefold.passes import run_pipeline

N = 4  # every dim; mesh axes of size 1 or 2 split it evenly


def gelu(a: np.ndarray) -> np.ndarray:
    return 0.5 * a * (1 + np.vectorize(erf)(a / sqrt(2)))


def softmax(a: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# name -> (IR line with {h} the input and {o} the output, NumPy meaning on (h, weight, bias))
STEPS = {
    "bias": ("%{o} = add(%{h}, %b) : f64[4,4]", lambda h, w, b: h + b),
    "sub": ("%{o} = sub(%{h}, %{h}) : f64[4,4]", lambda h, w, b: h - h),
    "gelu": ("%{o} = gelu(%{h}) : f64[4,4]", lambda h, w, b: gelu(h)),
    "neg": ("%{o} = neg(%{h}) : f64[4,4]", lambda h, w, b: -h),
    "square": ("%{o} = mul(%{h}, %{h}) : f64[4,4]", lambda h, w, b: h * h),
    "scale": ("%{o} = mul(%{h}, %b) : f64[4,4]", lambda h, w, b: h * b),
    "matmul": ("%{o} = matmul(%{h}, %w) : f64[4,4]", lambda h, w, b: h @ w),
    "softmax": ("%{o} = softmax(%{h}) {{axis = 0}} : f64[4,4]", lambda h, w, b: softmax(h, 0)),
    "transpose": ("%{o} = transpose(%{h}) {{perm = [1, 0]}} : f64[4,4]", lambda h, w, b: h.T),
    "norm": ("%{o} = layer_norm(%{h}, %b, %b) : f64[4,4]",
             lambda h, w, b: (h - h.mean(1, keepdims=True))
             / np.sqrt(h.var(1, keepdims=True) + 1e-5) * b + b),
    "tanh": ("%{o} = tanh(%{h}) : f64[4,4]", lambda h, w, b: np.tanh(h)),
    "heads": ("%{o}_h = reshape(%{h}) {{shape = [4,2,2]}} : f64[4,2,2]\n"
              "  %{o}_t = transpose(%{o}_h) {{perm = [1,0,2]}} : f64[2,4,2]\n"
              "  %{o} = reshape(%{o}_t) {{shape = [4,4]}} : f64[4,4]",
              lambda h, w, b: h.reshape(4, 2, 2).transpose(1, 0, 2).reshape(4, 4)),
    "unit": ("%{o}_e = expand_dims(%{h}) {{axes = [0]}} : f64[1,4,4]\n"
             "  %{o} = squeeze(%{o}_e) {{axes = [0]}} : f64[4,4]", lambda h, w, b: h),
    "flatten": ("%{o}f = reshape(%{h}) {{shape = [16]}} : f64[16]\n"
                "  %{o} = reshape(%{o}f) {{shape = [4, 4]}} : f64[4,4]", lambda h, w, b: h),
    "unsqueeze": ("%{o}u = reshape(%{h}) {{shape = [4, 1, 4]}} : f64[4,1,4]\n"
                  "  %{o} = reshape(%{o}u) {{shape = [4, 4]}} : f64[4,4]", lambda h, w, b: h),
}
ENDS = {
    "sum": ("%{o} = reduce_sum(%{h}) {{axes = [1]}} : f64[4]", lambda h: h.sum(1)),
    "max": ("%{o} = reduce_max(%{h}) {{axes = [0]}} : f64[4]", lambda h: h.max(0)),
}


def placement(draw, rank: int, partial: bool) -> str:
    options = ["R", *(f"S({d})" for d in range(rank))] + (["P(sum)"] if partial else [])
    return draw(st.sampled_from(options))


@st.composite
def chains(draw):
    sizes = [draw(st.sampled_from([1, 2])) for _ in range(2)]
    steps = draw(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5))
    end = draw(st.sampled_from(sorted(ENDS)))
    places = {
        name: ",".join(placement(draw, rank, name == "x") for _ in sizes)
        for name, rank in (("x", 2), ("w", 2), ("b", 1))
    }
    return sizes, steps, end, places


def chain_text(sizes, steps, end, places) -> str:
    lines, h = [], "x"
    for i, step in enumerate(steps):
        lines.append(STEPS[step][0].format(h=h, o=f"v{i}"))
        h = f"v{i}"
    lines.append(ENDS[end][0].format(h=h, o="out"))
    return (
        f"mesh @m [a={sizes[0]}, b={sizes[1]}]\n"
        f"func @main(%x: f64[4,4] @m[{places['x']}], %w: f64[4,4] @m[{places['w']}], "
        f"%b: f64[4] @m[{places['b']}]) -> (f64[4]) {{\n  "
        + "\n  ".join(lines) + "\n  return(%out)\n}"
    )


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(0, 2**32 - 1))
def test_random_chains_match_numpy(chain, seed) -> None:
    _, steps, end, _ = chain
    module = parse_module(chain_text(*chain))
    run_pipeline(module, "propagate-sharding,expand-redistribute")
    verify(module)
    rng = np.random.default_rng(seed)
    x, w, b = rng.standard_normal((N, N)), rng.standard_normal((N, N)), rng.standard_normal(N)
    want = x
    for step in steps:
        want = STEPS[step][1](want, w, b)
    want = ENDS[end][1](want)
    (got,) = simulate(module, x, w, b, rng=rng)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    (per_rank,) = run_spmd(module, partitioned(module), [x, w, b], rng=rng)
    np.testing.assert_allclose(per_rank, want, rtol=1e-9, atol=1e-9)
