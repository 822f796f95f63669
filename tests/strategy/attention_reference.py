"""Attention in float64 NumPy and the inputs the attention kernel tests draw: the oracle that
the flash and decode kernels are compared with."""

from __future__ import annotations

import numpy as np


def attention64(q, k, v, mask=None, causal: bool = False, scale: float | None = None
                ) -> np.ndarray:
    """softmax(q k^T scale + mask) v in float64; key/value head h serves query heads
    h * rep .. h * rep + rep - 1; a bool mask keeps True; causal keeps key j <= query i; a row
    that keeps no key gives zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    if scale is None:
        scale = 1 / np.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    s = q @ np.swapaxes(k, -1, -2) * scale
    keep = np.ones(s.shape[-2:], bool)
    if causal:
        keep = np.tril(keep)
    if mask is not None and mask.dtype == np.bool_:
        keep = keep & mask
    elif mask is not None:
        s = s + mask.astype(np.float64)
    s = np.where(keep, s, -np.inf)
    top = s.max(-1, keepdims=True, initial=-np.inf)
    p = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = p.sum(-1, keepdims=True)
    return np.where(total > 0, (p / np.where(total > 0, total, 1)) @ v, 0.0)


def staircase(rng, b: int, lq: int, lk: int) -> tuple[np.ndarray, np.ndarray]:
    """A static cache's bool mask [b, 1, lq, lk]: batch entry n holds `past[n] + lq` positions,
    query row i sees keys j <= past[n] + i; `past` is random, the first entry's as long as it
    can be, the last one's empty (no key seen at all by its first row when lq > 0)."""
    past = rng.integers(0, max(1, lk - lq + 1), b)
    if b:
        past[0], past[-1] = max(0, lk - lq), 0
    j = np.arange(lk)
    rows = past[:, None] + np.arange(lq)[None, :]
    mask = j[None, None, :] <= rows[:, :, None]
    if b > 1:
        mask[-1, 0] = False
    return mask[:, None], past


def cache_views(rng, b: int, hk: int, lk: int, e: int, ev: int) -> tuple[np.ndarray, np.ndarray]:
    """k and v as the first lk positions of longer caches: strided views, as a static cache's
    slices are."""
    kc = rng.standard_normal((b, hk, lk + 7, e), np.float32)
    vc = rng.standard_normal((b, hk, lk + 7, ev), np.float32)
    return kc[:, :, :lk], vc[:, :, :lk]


def head_major(rng, b: int, h: int, lq: int, e: int) -> np.ndarray:
    """q as a projection's [b, lq, h, e] seen head-major (a transposed view)."""
    return rng.standard_normal((b, lq, h, e), np.float32).transpose(0, 2, 1, 3)


def make_mask(rng, kind: str, b: int, h: int, lq: int, lk: int) -> np.ndarray | None:
    """none; prefix (`staircase`, broadcast over heads); random bool per head with one row
    keeping nothing; float: random values, -inf past a staircase and on one whole row."""
    if kind == "none":
        return None
    if kind == "prefix":
        return staircase(rng, b, lq, lk)[0]
    if kind == "random":
        mask = rng.random((b, h, lq, lk)) > 0.3
        if mask.size:
            mask[0, -1, 0] = False
        return mask
    seen = np.broadcast_to(staircase(rng, b, lq, lk)[0], (b, h, lq, lk))
    mask = np.where(seen, rng.standard_normal((b, h, lq, lk)), -np.inf).astype(np.float32)
    if mask.size:
        mask[0, 0, -1] = -np.inf
    return mask
