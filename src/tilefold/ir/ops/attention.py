"""Scaled dot-product attention kept as one op, so that it can compile to one fused kernel."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.ops.common import evaluate, require, round_to, same_dtype, widen
from tilefold.ir.shapes import broadcast_shapes
from tilefold.ir.types import TensorType


@register
class ScaledDotProductAttention(OpDef):
    """softmax(q @ k^T * scale + mask) @ v, as torch's `scaled_dot_product_attention`.

    q [..., H, L, E], k [..., Hk, S, E], v [..., Hk, S, Ev] -> [..., H, L, Ev]. The optional
    `mask` broadcasts to [..., H, L, S]: a bool mask keeps the True positions, a float mask is
    added to the scores. `is_causal` keeps key j <= query i (top-left aligned). `scale` defaults
    to 1/sqrt(E). `enable_gqa` lets H be a multiple of Hk (each key/value head serves H/Hk query
    heads). A query row with every key masked gives zeros, as PyTorch does.
    `%o = scaled_dot_product_attention(%q, %k, %v, %m) {scale = 0.125} : f32[?b,12,?s,64]`
    """

    name = "scaled_dot_product_attention"
    operands = ("q", "k", "v", "*mask")
    attributes = attr_table(
        is_causal=Attr("bool", False),
        scale=Attr("float", None, doc="None means 1/sqrt(E)"),
        enable_gqa=Attr("bool", False),
    )

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        q, k, v, *masks = types
        name = cls.name
        require(name, q, "float")
        dt = same_dtype(name, [q, k, v])
        if len(masks) > 1:
            raise ShapeError(f"{name}: takes at most one mask, got {len(masks)}")
        if not q.rank == k.rank == v.rank or q.rank < 2:
            raise ShapeError(f"{name}: q, k, v need one rank >= 2, got {q}, {k}, {v}")
        if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise ShapeError(
                f"{name}: q/k feature dims or k/v sequence dims differ: {q}, {k}, {v}"
            )
        if k.shape[:-2] != v.shape[:-2]:
            raise ShapeError(f"{name}: k and v batch dims differ: {k}, {v}")
        batch = cls._batch(q, k, attrs["enable_gqa"])
        if masks:
            (m,) = masks
            if m.dtype != dtypes.boolean and m.dtype != dt:
                raise DTypeError(f"{name}: mask must be bool or {dt}, got {m}")
            scores = (*batch, q.shape[-2], k.shape[-2])
            if broadcast_shapes(name, m.shape, scores) != scores:
                raise ShapeError(f"{name}: mask {m} does not broadcast to the scores {scores}")
        return [TensorType((*batch, q.shape[-2], v.shape[-1]), dt)]

    @staticmethod
    def _batch(q: TensorType, k: TensorType, gqa: bool) -> tuple:
        name = ScaledDotProductAttention.name
        if not gqa or q.rank < 3:
            return broadcast_shapes(name, q.shape[:-2], k.shape[:-2])
        hq, hk = q.shape[-3], k.shape[-3]
        if not (isinstance(hq, int) and isinstance(hk, int) and hk and hq % hk == 0):
            raise ShapeError(f"{name}: with enable_gqa, {hq} query heads need a multiple of {hk}")
        return (*broadcast_shapes(name, q.shape[:-3], k.shape[:-3]), hq)

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        def fn(q, k, v, *mask):
            if attrs["enable_gqa"] and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
                rep = q.shape[-3] // k.shape[-3]
                k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
            scores = np.matmul(q, np.swapaxes(k, -1, -2)) * _scale(attrs, q)
            keep = np.ones(scores.shape[-2:], dtype=bool)
            if attrs["is_causal"]:
                keep = np.tril(keep)
            if mask and args[3].dtype == np.bool_:
                keep = keep & mask[0]
            elif mask:
                scores = scores + mask[0]
            return _attend(np.where(keep, scores, -np.inf), v)[0]

        return evaluate(fn, args, dtypes.dtype(args[0].dtype))


@register
class AttentionForward(OpDef):
    """Attention that also gives each query row's log-sum-exp, as a training forward saves it
    for `attention_backward` (the flash-attention forward):

        s   = q @ k^T * scale + bias
        out = softmax(s) @ v,  lse = log(sum(exp(s)))     zeros and -inf where no key is kept

    q [..., L, E], k [..., S, E], v [..., S, Ev], one batch shape (grouped-query heads are
    repeated before); the optional float `bias` broadcasts to [..., L, S] (masks and the causal
    triangle as 0 / -inf). `scale` defaults to 1/sqrt(E).
    `%o, %lse = attention_forward(%q, %k, %v, %bias) {scale = 0.125}`
    """

    name = "attention_forward"
    operands = ("q", "k", "v", "*bias")
    attributes = attr_table(scale=Attr("float", None, doc="None means 1/sqrt(E)"))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        q, k, v, *bias = types
        name = cls.name
        require(name, q, "float")
        dt = same_dtype(name, [q, k, v, *bias])
        if len(bias) > 1:
            raise ShapeError(f"{name}: takes at most one bias, got {len(bias)}")
        if not q.rank == k.rank == v.rank >= 2:
            raise ShapeError(f"{name}: q, k, v need one rank >= 2, got {q}, {k}, {v}")
        batch = q.shape[:-2]
        if k.shape[:-2] != batch or v.shape[:-2] != batch:
            raise ShapeError(f"{name}: q, k and v need one batch shape, got {q}, {k}, {v}")
        if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise ShapeError(f"{name}: q/k feature dims or k/v sequence dims differ: "
                             f"{q}, {k}, {v}")
        rows = (*batch, q.shape[-2])
        if bias:
            scores = (*rows, k.shape[-2])
            if broadcast_shapes(name, bias[0].shape, scores) != scores:
                raise ShapeError(f"{name}: bias {bias[0]} does not broadcast to the scores "
                                 f"{scores}")
        return [TensorType((*rows, v.shape[-1]), dt), TensorType(rows, dt)]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        dt = dtypes.dtype(args[0].dtype)
        scale = _scale(attrs, args[0])

        def forward(q, k, v, *bias):
            s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
            return _attend(s + bias[0] if bias else s, v)

        with np.errstate(all="ignore"):
            return [round_to(x, dt) for x in forward(*(widen(a) for a in args))]


def _attend(scores: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
    """softmax(scores) @ v and each row's log-sum-exp; a row that keeps no key (all -inf, or
    no keys at all) gives zeros and -inf."""
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = np.sum(e, axis=-1, keepdims=True)
    out = np.matmul(np.where(total > 0, e / np.where(total > 0, total, 1), 0), v)
    return [out, np.where(total > 0, np.log(total) + top, -np.inf)[..., 0]]


def _scale(attrs: dict[str, Any], q: np.ndarray) -> float:
    """The attribute, or 1/sqrt(E) (any scale where there are no features: every score is 0)."""
    if attrs["scale"] is not None:
        return attrs["scale"]
    return 1 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0


@register
class AttentionBackward(OpDef):
    """The gradients of attention's q, k and v, recomputing the probabilities from one
    log-sum-exp per query row (the flash-attention backward):

        p  = exp(q @ k^T * scale + bias - lse)      0 where both are -inf (no key kept)
        dv = p^T @ dout
        ds = p * (dout @ v^T - delta) * scale       delta: each row's <dout, out>
        dq = ds @ k,  dk = ds^T @ q

    dout [..., L, Ev], q [..., L, E], k [..., S, E], v [..., S, Ev], lse and delta [..., L]
    (one batch shape: grouped-query heads are repeated before and summed after); the optional
    float `bias` broadcasts to [..., L, S] (masks and the causal triangle as 0 / -inf).
    `scale` defaults to 1/sqrt(E).
    `%dq, %dk, %dv = attention_backward(%do, %q, %k, %v, %lse, %delta, %bias) {scale = 0.125}`
    """

    name = "attention_backward"
    operands = ("dout", "q", "k", "v", "lse", "delta", "*bias")
    attributes = attr_table(scale=Attr("float", None, doc="None means 1/sqrt(E)"))

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        dout, q, k, v, lse, delta, *bias = types
        name = cls.name
        require(name, q, "float")
        same_dtype(name, [dout, q, k, v, lse, delta, *bias])
        if len(bias) > 1:
            raise ShapeError(f"{name}: takes at most one bias, got {len(bias)}")
        if not dout.rank == q.rank == k.rank == v.rank == lse.rank + 1 == delta.rank + 1 >= 2:
            raise ShapeError(f"{name}: dout, q, k, v need one rank >= 2 and lse, delta one "
                             f"less, got {dout}, {q}, {k}, {v}, {lse}, {delta}")
        batch = q.shape[:-2]
        if k.shape[:-2] != batch or v.shape[:-2] != batch or dout.shape[:-2] != batch:
            raise ShapeError(f"{name}: q, k, v and dout need one batch shape, got "
                             f"{q}, {k}, {v}, {dout}")
        rows = (*batch, q.shape[-2])
        if (q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]
                or dout.shape[-1] != v.shape[-1] or dout.shape[-2] != q.shape[-2]
                or lse.shape != rows or delta.shape != rows):
            raise ShapeError(f"{name}: the dims of {dout}, {q}, {k}, {v}, {lse}, {delta} do "
                             f"not line up as attention's")
        if bias:
            scores = (*rows, k.shape[-2])
            if broadcast_shapes(name, bias[0].shape, scores) != scores:
                raise ShapeError(f"{name}: bias {bias[0]} does not broadcast to the scores "
                                 f"{scores}")
        return [q, k, v]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> Any:
        dt = dtypes.dtype(args[1].dtype)
        scale = _scale(attrs, args[1])

        def grads(dout, q, k, v, lse, delta, *bias):
            s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
            if bias:
                s = s + bias[0]
            p = np.exp(s - lse[..., None])
            p = np.where(np.isnan(p), 0.0, p)
            ds = p * (np.matmul(dout, np.swapaxes(v, -1, -2)) - delta[..., None]) * scale
            return [np.matmul(ds, k), np.matmul(np.swapaxes(ds, -1, -2), q),
                    np.matmul(np.swapaxes(p, -1, -2), dout)]

        with np.errstate(all="ignore"):
            return [round_to(g, dt) for g in grads(*(widen(a) for a in args))]
