"""The graphs the ahead-of-time tests export: every step of each runs natively (an export
refuses any other), with weights as constants (so the artifact's data file holds them)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tilefold import Builder, Module

RNG_SEED = 36


def _weights(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def mlp(rng: np.random.Generator) -> Module:
    """GEMM + bias + gelu, then a GEMM + bias."""
    b = Builder()
    x = b.arg("x", "f32", (8, 64))
    h = b.op("gelu", x @ b.constant(_weights((64, 96), rng)) + b.constant(_weights((96,), rng)))
    return b.build(h @ b.constant(_weights((96, 32), rng)) + b.constant(_weights((32,), rng)))


def norms(rng: np.random.Generator) -> Module:
    """A residual layer_norm with constant gain and shift, and a softmax of it."""
    b = Builder()
    x, r = b.arg("x", "f32", (6, 40)), b.arg("r", "f32", (6, 40))
    y = b.op("layer_norm", x + r, b.constant(_weights((40,), rng) + 1),
             b.constant(_weights((40,), rng)), eps=1e-5)
    return b.build(b.op("softmax", y), y)


def views(rng: np.random.Generator) -> Module:
    """Reshapes around a GEMM, a transpose read in place by an elementwise kernel, and one
    reshaped (a native strided copy)."""
    b = Builder()
    x = b.arg("x", "f32", (4, 6, 8))
    rows = b.op("reshape", x, shape=(24, 8)) @ b.constant(_weights((8, 12), rng))
    heads = b.op("transpose", b.op("reshape", rows, shape=(4, 6, 12)), perm=(1, 0, 2))
    flat = b.op("reshape", heads, shape=(6, 48))
    return b.build(b.op("tanh", heads) * b.constant(_weights((12,), rng)),
                   b.op("exp", flat))


def attention(rng: np.random.Generator) -> Module:
    """Causal self-attention over two heads: a kernel that reads its operands' dims and
    strides out of the array objects it is handed (headers, in an artifact)."""
    b = Builder()
    x = b.arg("x", "f32", (16, 32))

    def heads(t):
        return b.op("transpose", b.op("reshape", t, shape=(1, 16, 2, 16)), perm=(0, 2, 1, 3))

    q, k, v = (heads(x @ b.constant(_weights((32, 32), rng))) for _ in range(3))
    a = b.op("scaled_dot_product_attention", q, k, v, is_causal=True)
    return b.build(b.op("reshape", b.op("transpose", a, perm=(0, 2, 1, 3)), shape=(16, 32)))


GRAPHS: dict[str, Callable[[np.random.Generator], Module]] = {
    "mlp": mlp, "norms": norms, "views": views, "attention": attention}


def random_inputs(module: Module, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(a.type.shape).astype(np.float32) for a in module["main"].args]
