"""float64 NumPy meanings of the GPT-2 and LLaMA layers that `tilefold.distributed.blocks`
builds, read from a dict of named parameters (the oracle of the planning tests)."""

from __future__ import annotations

from math import erf, sqrt

import numpy as np

from tilefold.distributed import BlockShape


def layer_norm(x, w, b, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def rms_norm(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gelu(a):
    return 0.5 * a * (1 + np.vectorize(erf)(a / sqrt(2)))


def causal_attention(q, k, v):
    """q [b, H, s, hd], k and v [b, Hk, s, hd] (each key/value head serves H/Hk queries)."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def heads(x, shape: BlockShape, n: int):
    return x.reshape(shape.batch, shape.seq, n, shape.head_dim).transpose(0, 2, 1, 3)


def attention(p, x, prm, shape: BlockShape, bias: bool, fused: bool):
    def linear(name, h):
        return h @ prm[f"{p}_{name}_w"] + (prm[f"{p}_{name}_b"] if bias else 0)

    hd, kv = shape.head_dim, shape.kv_heads or shape.heads
    if fused:
        qkv = linear("qkv", x).reshape(shape.batch, shape.seq, shape.heads, 3 * hd)
        q, k, v = (qkv[..., i * hd:(i + 1) * hd].transpose(0, 2, 1, 3) for i in range(3))
    else:
        q = heads(linear("q", x), shape, shape.heads)
        k, v = heads(linear("k", x), shape, kv), heads(linear("v", x), shape, kv)
    a = causal_attention(q, k, v).transpose(0, 2, 1, 3).reshape(-1, shape.d)
    return linear("o", a)


def gpt2(prm: dict, shape: BlockShape, fused: bool = False) -> np.ndarray:
    x = prm["x"]
    for i in range(shape.layers):
        p = f"l{i}"
        n1 = layer_norm(x, prm[f"{p}_ln1_w"], prm[f"{p}_ln1_b"])
        r1 = x + attention(p, n1, prm, shape, True, fused)
        n2 = layer_norm(r1, prm[f"{p}_ln2_w"], prm[f"{p}_ln2_b"])
        h = gelu(n2 @ prm[f"{p}_fc1_w"] + prm[f"{p}_fc1_b"])
        x = r1 + h @ prm[f"{p}_fc2_w"] + prm[f"{p}_fc2_b"]
    return x


def llama(prm: dict, shape: BlockShape) -> np.ndarray:
    x = prm["x"]
    for i in range(shape.layers):
        p = f"l{i}"
        r1 = x + attention(p, rms_norm(x, prm[f"{p}_norm1"]), prm, shape, False, False)
        n2 = rms_norm(r1, prm[f"{p}_norm2"])
        g = n2 @ prm[f"{p}_gate_w"]
        x = r1 + (g / (1 + np.exp(-g)) * (n2 @ prm[f"{p}_up_w"])) @ prm[f"{p}_down_w"]
    return x
