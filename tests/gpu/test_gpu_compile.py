"""`tilefold.compile(module, target="h200")` on CPU torch tensors under Triton's interpreter (or
compiled on CUDA ones: `placement.py`): whole fused graphs (memory-bound groups as Triton
kernels, GEMM groups as torch.matmul plus a Triton epilogue) against float64 NumPy, and strict
mode refusing host round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

import tilefold as tf  # noqa: E402
from tests.gpu.placement import f64, host, tensor  # noqa: E402
from tests.tolerances import assert_close  # noqa: E402
from tilefold.errors import FallbackError  # noqa: E402
from tilefold.ir import Builder  # noqa: E402
from tilefold.ir import functional as F  # noqa: E402

RNG = np.random.default_rng(61)
erf = np.vectorize(math.erf)


def _block(n, d: int, f: int):
    """x -> layer_norm -> matmul + bias -> gelu -> matmul + bias -> residual -> softmax (`n`
    may be a symbolic dim's name)."""
    b = Builder("main")
    x = b.arg("x", "f32", (n, d))
    w1 = b.constant((RNG.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32))
    b1 = b.constant(RNG.standard_normal(f).astype(np.float32))
    w2 = b.constant((RNG.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32))
    b2 = b.constant(RNG.standard_normal(d).astype(np.float32))
    g = b.constant(RNG.uniform(0.5, 1.5, d).astype(np.float32))
    beta = b.constant(RNG.standard_normal(d).astype(np.float32))
    h = F.layer_norm(x, g, beta, eps=1e-5)
    h = F.gelu(F.matmul(h, w1) + b1)
    y = F.matmul(h, w2) + b2 + x
    return b.build(F.softmax(y, axis=-1)), [w1, b1, w2, b2, g, beta]


def _reference(x, module):
    consts = [op.attrs["value"].astype(np.float64) for op in module["main"].ops
              if op.name == "constant"]
    w1, b1, w2, b2, g, beta = consts
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    h = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + beta
    a = h @ w1 + b1
    h = 0.5 * a * (1 + erf(a / np.sqrt(2)))
    y = h @ w2 + b2 + x
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# (rows, features, hidden, GEMMs on the template, GEMMs on torch.matmul + a Triton epilogue):
# the second GEMM's epilogue ends in a row softmax, which the template's column tiles refuse;
# with a symbolic M both wait for torch.matmul.
@pytest.mark.parametrize("n, d, f, template, cublas", [
    (7, 32, 48, 1, 1), (1, 16, 16, 1, 1), (33, 64, 96, 1, 1), ("rows", 32, 48, 0, 2)])
def test_a_block_runs_on_the_gpu_path(n, d, f, template, cublas):
    module, _ = _block(n, d, f)
    graph = tf.compile(module, target="h200", strict=True)
    lines = graph.report()
    assert sum(line.endswith("Triton GEMM template") for line in lines) == template, lines
    assert sum("torch.matmul + Triton epilogue" in line for line in lines) == cublas, lines
    assert any(line.endswith("Triton kernel") for line in lines), lines
    assert not any("host" in line for line in lines), lines
    n = 9 if isinstance(n, str) else n
    x = RNG.standard_normal((n, d)).astype(np.float32)
    (got,) = graph(tensor(x))
    assert isinstance(got, torch.Tensor)
    assert_close(host(got), _reference(x, module), dtype="f32", reduced=f)


def test_transposed_weight_prologue_and_views():
    """A transposed constant weight (a view prologue), a reshape of the result, and an output
    that is the GEMM's C itself."""
    b = Builder("main")
    x = b.arg("x", "f32", (6, 20))
    w = b.constant(RNG.standard_normal((12, 20)).astype(np.float32))
    c = F.matmul(x, F.transpose(w, (1, 0)))
    module = b.build(F.reshape(F.relu(c), (3, 24)), c)
    graph = tf.compile(module, target="h200", strict=True)
    xv = RNG.standard_normal((6, 20)).astype(np.float32)
    got_r, got_c = graph(tensor(xv))
    wv = next(op.attrs["value"] for op in module["main"].ops if op.name == "constant")
    want_c = xv.astype(np.float64) @ wv.astype(np.float64).T
    assert_close(host(got_c), want_c, dtype="f32", reduced=20)
    assert_close(host(got_r), np.maximum(want_c, 0).reshape(3, 24), dtype="f32", reduced=20)


def test_strict_mode_refuses_a_host_round_trip():
    b = Builder("main")
    x = b.arg("x", "f32", (5, 8))
    module = b.build(b.op("cumsum", x, axis=1))
    with pytest.raises(FallbackError, match=r"cumsum.*host"):
        tf.compile(module, target="h200", strict=True)
    graph = tf.compile(module, target="h200", strict=False)
    assert any("host NumPy reference" in line for line in graph.report())
    xv = RNG.standard_normal((5, 8)).astype(np.float32)
    (got,) = graph(tensor(xv))
    np.testing.assert_allclose(host(got), np.cumsum(xv.astype(np.float64), axis=1),
                               rtol=1e-5, atol=1e-5)


def test_attention_runs_on_the_attention_template():
    """A causal scaled_dot_product_attention with grouped-query heads: the fused template."""
    b = Builder("main")
    q = b.arg("q", "f32", (1, 4, 9, 16))
    k = b.arg("k", "f32", (1, 2, 9, 16))
    v = b.arg("v", "f32", (1, 2, 9, 16))
    module = b.build(b.op("scaled_dot_product_attention", q, k, v, is_causal=True,
                          enable_gqa=True))
    graph = tf.compile(module, target="h200", strict=True)
    assert any(line.endswith("Triton attention template") for line in graph.report())
    qv, kv, vv = (RNG.standard_normal(s).astype(np.float32)
                  for s in ((1, 4, 9, 16), (1, 2, 9, 16), (1, 2, 9, 16)))
    (got,) = graph(*map(tensor, (qv, kv, vv)))
    kr, vr = (np.repeat(a.astype(np.float64), 2, axis=1) for a in (kv, vv))
    scores = qv.astype(np.float64) @ kr.transpose(0, 1, 3, 2) / 4.0
    scores = np.where(np.tril(np.ones((9, 9), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vr
    assert_close(host(got), want, dtype="f32", reduced=16)


def test_constants_are_copied_to_the_inputs_device_once():
    """A weight is made a tensor on the call's device on the first call only (no copy per call,
    none inside a CUDA graph), and the result still matches float64 NumPy."""
    module, _ = _block(5, 16, 24)
    graph = tf.compile(module, target="h200", strict=True)
    x = RNG.standard_normal((5, 16)).astype(np.float32)
    graph(tensor(x))
    consts = [s for s in graph.steps if s.op.name == "constant"]
    assert consts
    made = [s.run([])[0] for s in consts]
    (got,) = graph(tensor(x))
    assert all(s.run([])[0] is t for s, t in zip(consts, made, strict=True))
    assert_close(host(got), _reference(x, module), dtype="f32", reduced=24)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_scalar_constants_stay_0_d(dtype):
    """`relu(x * 2 + 1)`: the scalars are 0-d constants, made 0-d tensors (a 1-element 1-d
    tensor broke the group's signature)."""
    b = Builder("main")
    x = b.arg("x", dtype, (3, 5))
    graph = tf.compile(b.build(F.relu(x * 2.0 + 1.0)), target="h200", strict=True)
    xv = RNG.standard_normal((3, 5)).astype(np.float32)
    xt = tensor(xv).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    (got,) = graph(xt)
    want = np.maximum(f64(xt) * 2 + 1, 0)
    assert_close(host(got), want, dtype=dtype)
