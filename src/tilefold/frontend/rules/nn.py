"""Lowering rules for compute ATen ops: matmuls, attention, normalization, softmax, reductions,
running sums."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tilefold import dtypes
from tilefold.frontend.context import LoweringContext, Merged, Unavailable
from tilefold.frontend.lowering import NotApplicable, lowering
from tilefold.frontend.preserved import linear as _opaque_linear  # noqa: F401  (defines the ops)
from tilefold.frontend.training_attention import attention_backward as _attention_backward  # noqa: F401
from tilefold.frontend.training_attention import attention_forward as _attention_forward  # noqa: F401

aten = torch.ops.aten
SAVED = "a statistic saved for backward (not computed at inference)"


# -- matrix products -----------------------------------------------------------------------


@lowering(aten.mm.default)
def mm(ctx: LoweringContext, a: Any, b: Any) -> Any:
    """a @ b; rows flattened from symbolic dims stay unflattened"""
    return _rows_matmul(ctx, a, ctx.tensor(b))


@lowering(aten.addmm.default)
def addmm(ctx: LoweringContext, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """beta * bias + alpha * (a @ b); beta = 0 ignores bias (its NaNs too), as PyTorch"""
    beta, alpha = ctx.number(beta), ctx.number(alpha)  # beta == 0 decides the IR
    if not all(isinstance(v, int | float) for v in (beta, alpha)):
        raise NotApplicable(f"addmm with beta={beta}, alpha={alpha}")
    product = _rows_matmul(ctx, a, ctx.tensor(b))
    if alpha != 1:
        product = _map(product, lambda t: ctx.op("mul", t, ctx.scalar(alpha, t.dtype)))
    if beta == 0:  # the product is already [M, N], addmm's result shape
        return product
    return _add_bias(ctx, product, bias, beta)


def _map(product: Any, fn: Any) -> Any:
    """fn applied to a product's tensor, keeping it merged if it is."""
    if isinstance(product, Merged):
        return Merged(fn(product.tensor), product.lead)
    return fn(product)


def _add_bias(ctx: LoweringContext, product: Any, bias: Any, beta: float = 1) -> Any:
    def add(t: Any) -> Any:
        b = ctx.cast(ctx.tensor(bias), t.dtype)
        return ctx.op("add", t, b if beta == 1 else ctx.op("mul", b, ctx.scalar(beta, t.dtype)))

    return _map(product, add)


def _rows_matmul(ctx: LoweringContext, a: Any, b: Any) -> Any:
    return ctx.trailing(a, lambda t: ctx.op("matmul", t, b), 1)  # rows are independent


@lowering(aten.bmm.default)
def bmm(ctx: LoweringContext, a: Any, b: Any) -> Any:
    """batched a @ b; batches flattened from the same symbolic dims stay unflattened"""
    va, vb = ctx.value(a), ctx.value(b)
    if isinstance(va, Merged) or isinstance(vb, Merged):
        same = (
            isinstance(va, Merged) and isinstance(vb, Merged) and va.lead == vb.lead
            and all(ctx.sizes.same(x, y) for x, y in
                    zip(va.tensor.shape[: va.lead], vb.tensor.shape[: vb.lead], strict=True))
        )
        if not same:
            raise NotApplicable("bmm of batches flattened from different shapes")
        return Merged(ctx.op("matmul", va.tensor, vb.tensor), va.lead)
    return ctx.op("matmul", va, vb)


@lowering(aten.matmul.default, whole=True)
def matmul(ctx: LoweringContext, a: Any, b: Any) -> Any:
    """np.matmul semantics, as torch.matmul (merged rows times a matrix stay merged)"""
    if isinstance(ctx.value(a), Merged) and ctx.rank(b) == 2:
        return _rows_matmul(ctx, a, ctx.tensor(b))
    return ctx.op("matmul", ctx.tensor(a), ctx.tensor(b))


@lowering(aten.linear.default, torch.ops.tilefold.linear.default, whole=True)
def linear(ctx: LoweringContext, x: Any, weight: Any, bias: Any = None) -> Any:
    """x @ weight^T + bias"""
    product = _rows_matmul_t(ctx, x, ctx.tensor(weight))
    return product if bias is None else _add_bias(ctx, product, bias)


def _rows_matmul_t(ctx: LoweringContext, x: Any, w: Any) -> Any:
    return ctx.trailing(x, lambda t: ctx.op("matmul", t, w, transpose_b=True), 1)


# -- attention -----------------------------------------------------------------------------


@lowering(aten.scaled_dot_product_attention.default, torch.ops.tilefold.sdpa.default, whole=True)
def sdpa(
    ctx: LoweringContext, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> Any:
    """one scaled_dot_product_attention op (mask, causal, scale, grouped-query heads)"""
    return _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_cpu(
    ctx: LoweringContext, q: Any, k: Any, v: Any, dropout_p: float = 0.0, is_causal: bool = False,
    *, attn_mask: Any = None, scale: float | None = None,
) -> list[Any]:
    """the CPU flash-attention form AOTAutograd produces; its logsumexp is not computed"""
    out = _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, False)
    return [out, Unavailable(SAVED)]


@lowering(torch.ops.tilefold.attention_forward.default)
def attention_forward(ctx: LoweringContext, q: Any, k: Any, v: Any, bias: Any = None,
                      scale: float | None = None) -> list[Any]:
    """the flash-attention forward of a training graph, with its log-sum-exp, as one op"""
    ts = [ctx.tensor(x) for x in (q, k, v)]
    if bias is not None:
        ts.append(ctx.cast(ctx.tensor(bias), ts[0].dtype))
    attrs = {} if scale is None else {"scale": float(scale)}
    return ctx.op("attention_forward", *ts, **attrs)


@lowering(torch.ops.tilefold.attention_backward.default)
def attention_backward(ctx: LoweringContext, dout: Any, q: Any, k: Any, v: Any, lse: Any,
                       delta: Any, bias: Any = None, scale: float | None = None) -> list[Any]:
    """the flash-attention backward of a training graph (`frontend/training_attention.py`)"""
    ts = [ctx.tensor(x) for x in (dout, q, k, v, lse, delta)]
    if bias is not None:
        ts.append(ctx.cast(ctx.tensor(bias), ts[1].dtype))
    attrs = {} if scale is None else {"scale": float(scale)}
    return ctx.op("attention_backward", *ts, **attrs)


def _attention(ctx, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> Any:
    if dropout_p:
        raise NotApplicable(f"attention dropout p={dropout_p}")
    ts = [ctx.tensor(q), ctx.tensor(k), ctx.tensor(v)]
    if mask is not None:
        m = ctx.tensor(mask)
        ts.append(m if m.dtype.name == "bool" else ctx.cast(m, ts[0].dtype))
    attrs: dict[str, Any] = {"is_causal": bool(is_causal), "enable_gqa": bool(enable_gqa)}
    if scale is not None:
        attrs["scale"] = float(scale)
    return ctx.op("scaled_dot_product_attention", *ts, **attrs)


# -- normalization and softmax -------------------------------------------------------------


def _affine(ctx: LoweringContext, arg: Any, x: Any, ndims: int, fill: float) -> Any:
    if arg is not None:
        return ctx.cast(ctx.tensor(arg), x.dtype)
    shape = tuple(x.shape[x.ndim - ndims:])
    if not all(isinstance(d, int) for d in shape):  # the fill broadcast to the symbolic dims
        return ctx.op("broadcast_to", ctx.scalar(fill, x.dtype), shape=shape)
    return ctx.b.constant(np.full(shape, fill, dtype=x.dtype.np_dtype))


@lowering(aten.native_layer_norm.default)
def native_layer_norm(
    ctx: LoweringContext, x: Any, normalized_shape: list[int], weight: Any, bias: Any, eps: float
) -> list:
    """layer_norm, its mean and its 1/sqrt(variance + eps) (unused ones are dead code)"""
    out = _layer_norm(ctx, x, normalized_shape, weight, bias, eps)
    try:
        return [out, *_moments(ctx, ctx.tensor(x), len(normalized_shape), eps)]
    except NotApplicable as exc:
        return [out, Unavailable(exc.reason), Unavailable(exc.reason)]


def _moments(ctx: LoweringContext, t: Any, n: int, eps: float) -> list[Any]:
    """Mean and rstd over the last n dims, kept as size-1 dims; bf16/f16 computed in f32."""
    wide = dtypes.f32 if t.dtype in (dtypes.bf16, dtypes.f16) else t.dtype
    w = ctx.cast(t, wide)
    axes = list(range(t.ndim - n, t.ndim))
    mean = ctx.op("reduce_mean", w, axes=axes, keepdims=True)
    centered = ctx.op("sub", w, mean)
    var = ctx.op("reduce_mean", ctx.op("mul", centered, centered), axes=axes, keepdims=True)
    rstd = ctx.op("rsqrt", ctx.op("add", var, ctx.scalar(float(eps), wide)))
    return [ctx.cast(mean, ctx.out_dtype(1)), ctx.cast(rstd, ctx.out_dtype(2))]


@lowering(aten.layer_norm.default, whole=True)
def layer_norm(ctx: LoweringContext, x: Any, normalized_shape: list[int], weight: Any = None,
               bias: Any = None, eps: float = 1e-5, cudnn_enable: bool = True) -> Any:
    """layer_norm over the trailing normalized_shape dims"""
    return _layer_norm(ctx, x, normalized_shape, weight, bias, eps)


def _layer_norm(ctx, x, normalized_shape, weight, bias, eps) -> Any:
    n = len(normalized_shape)

    def norm(t):
        w, b = _affine(ctx, weight, t, n, 1.0), _affine(ctx, bias, t, n, 0.0)
        return ctx.op("layer_norm", t, w, b, axis=-n, eps=float(eps))

    return ctx.trailing(x, norm, n)  # rows flattened from symbolic dims stay unflattened


@lowering(aten.rms_norm.default, whole=True)
def rms_norm(ctx: LoweringContext, x: Any, normalized_shape: list[int], weight: Any = None,
             eps: float | None = None) -> Any:
    """RMSNorm; eps None means the dtype's machine epsilon, as PyTorch"""
    n = len(normalized_shape)

    def norm(t):
        e = float(np.finfo(t.dtype.np_dtype).eps) if eps is None else float(eps)
        return ctx.op("rms_norm", t, _affine(ctx, weight, t, n, 1.0), axis=-n, eps=e)

    return ctx.trailing(x, norm, n)


@lowering(aten._softmax.default, aten._log_softmax.default)
def softmax_(ctx: LoweringContext, x: Any, dim: int, half_to_float: bool) -> Any:
    """softmax / log_softmax along dim"""
    name = "softmax" if ctx.node.target is aten._softmax.default else "log_softmax"
    return _softmax(ctx, name, x, dim)


@lowering(aten.softmax.int, aten.log_softmax.int, whole=True)
def softmax(ctx: LoweringContext, x: Any, dim: int, dtype: Any = None) -> Any:
    """softmax / log_softmax along dim, optionally in another dtype"""
    name = "softmax" if ctx.node.target is aten.softmax.int else "log_softmax"
    return _softmax(ctx, name, x, dim)


def _softmax(ctx: LoweringContext, name: str, x: Any, dim: int) -> Any:
    rank = ctx.rank(x)
    if rank == 0:  # PyTorch takes a 0-d tensor as one element along dim 0 (or -1)
        one = ctx.op("expand_dims", ctx.cast(ctx.tensor(x), ctx.out_dtype()), axes=[0])
        return ctx.op("squeeze", ctx.op(name, one, axis=0), axes=[0])
    dim %= rank
    return ctx.trailing(  # a merged tensor has t.ndim - rank more leading dims
        x, lambda t: ctx.op(name, ctx.cast(t, ctx.out_dtype()), axis=dim + t.ndim - rank),
        rank - dim)


# -- reductions ----------------------------------------------------------------------------


def _reduced_axes(dim: Any, rank: int) -> list[int] | None:
    """ATen's reduction dims as IR axes; None (all) for no dims, or for a 0-d tensor, whose
    only dim PyTorch names 0 or -1."""
    if dim is None or list(dim) == [] or rank == 0:
        return None
    return [d % rank for d in dim]


REDUCTIONS = {  # ATen overload -> tilefold op
    aten.sum.dim_IntList: "reduce_sum",
    aten.sum.default: "reduce_sum",
    aten.mean.dim: "reduce_mean",
    aten.mean.default: "reduce_mean",
    aten.amax.default: "reduce_max",
    aten.amin.default: "reduce_min",
    aten.max.default: "reduce_max",
    aten.min.default: "reduce_min",
}


def _reduction(name: str):
    def rule(ctx: LoweringContext, x: Any, dim: Any = None, keepdim: bool = False, *,
             dtype: Any = None) -> Any:
        rank = ctx.rank(x)
        axes = _reduced_axes(dim, rank)

        def reduce(t):  # a merged tensor has t.ndim - rank more leading dims
            shifted = None if axes is None else [a + t.ndim - rank for a in axes]
            return ctx.op(name, ctx.cast(t, ctx.out_dtype()), axes=shifted,
                          keepdims=bool(keepdim))

        return ctx.trailing(x, reduce, rank if axes is None else rank - min(axes, default=rank))

    rule.__doc__ = f"{name} over dims"
    return rule


for _target, _name in REDUCTIONS.items():
    lowering(_target)(_reduction(_name))


F32_EXACT = 1 << 24  # every position up to this is an f32


@lowering(aten.max.dim, aten.min.dim)
def max_with_indices(ctx: LoweringContext, x: Any, dim: int, keepdim: bool = False) -> Any:
    """(values, indices) of the largest (smallest) element along dim: the reduction, then the
    first position holding it (or holding a NaN, which PyTorch's max and min return): the
    smallest of those positions along dim, the others set past the end"""
    t = ctx.tensor(x)
    smallest = ctx.node.target == aten.min.dim
    i64 = dtypes.i64
    if t.ndim == 0:  # the one element, at position 0
        return [t, ctx.scalar(0, i64)]
    dim %= t.ndim
    values = ctx.op("reduce_min" if smallest else "reduce_max", t, axes=[dim], keepdims=True)
    hit = ctx.op("or", ctx.op("eq", t, values), ctx.op("ne", t, t))
    size = t.shape[dim]
    # positions compare exactly as f32 there, so the search fuses with f32 work around it
    dt = dtypes.f32 if isinstance(size, int) and size < F32_EXACT else i64
    line = ctx.op("arange", shape=[size], dtype=dt)
    others = [a for a in range(t.ndim) if a != dim]
    line = ctx.op("expand_dims", line, axes=others) if others else line
    past = ctx.scalar(size, dt) if isinstance(size, int) else ctx.cast(ctx.size_value(size), dt)
    first = ctx.op("reduce_min", ctx.op("where", hit, line, past), axes=[dim], keepdims=True)
    indices = ctx.cast(first, i64)
    if not keepdim:
        values = ctx.op("squeeze", values, axes=[dim])
        indices = ctx.op("squeeze", indices, axes=[dim])
    return [values, indices]


@lowering(aten.any.dim, aten.any.dims, aten.any.default)
def any_(ctx: LoweringContext, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    """whether any element over dims is nonzero: max of (x != 0) as f32, then != 0 (the
    math attention's fully-masked-row test, in the backward graph of SDPA)"""
    rank = ctx.rank(x)
    dims = [dim] if isinstance(dim, int) else dim
    axes = _reduced_axes(dims, rank)
    t = ctx.tensor(x)
    hit = ctx.cast(ctx.op("ne", t, ctx.scalar(0, t.dtype)), dtypes.f32)
    top = ctx.op("reduce_max", hit, axes=axes, keepdims=bool(keepdim))
    return ctx.op("ne", top, ctx.scalar(0, dtypes.f32))


@lowering(aten.cumsum.default)
def cumsum(ctx: LoweringContext, x: Any, dim: int, *, dtype: Any = None) -> Any:
    """running sum along dim, in the result's dtype (PyTorch sums bools and integers in i64;
    a 0-d tensor is its own sum)"""
    t = ctx.cast(ctx.tensor(x), ctx.out_dtype())
    return ctx.op("cumsum", t, axis=dim % t.ndim) if t.ndim else t


@lowering(aten.linalg_vector_norm.default)
def vector_norm(ctx: LoweringContext, x: Any, ord: float = 2, dim: Any = None,
                keepdim: bool = False, *, dtype: Any = None) -> Any:
    """p-norm of any order; bf16/f16 are computed in f32 and rounded once, as PyTorch"""
    out = ctx.out_dtype()
    wide = dtypes.f32 if out in (dtypes.bf16, dtypes.f16) else out
    t = ctx.cast(ctx.tensor(x), wide)
    axes = _reduced_axes(dim, t.ndim)

    def reduce(name: str, v: Any) -> Any:
        return ctx.op(name, v, axes=axes, keepdims=bool(keepdim))

    p = float(ctx.number(ord))  # the order picks the formula
    if p == float("inf") or p == float("-inf"):
        norm = reduce("reduce_max" if p > 0 else "reduce_min", ctx.op("abs", t))
    elif p == 0:  # the number of nonzero elements
        norm = reduce("reduce_sum", ctx.cast(ctx.op("ne", t, ctx.scalar(0, wide)), wide))
    elif p == 1:
        norm = reduce("reduce_sum", ctx.op("abs", t))
    elif p == 2:
        norm = ctx.op("sqrt", reduce("reduce_sum", ctx.op("mul", t, t)))
    else:
        powers = ctx.op("pow", ctx.op("abs", t), ctx.scalar(p, wide))
        norm = ctx.op("pow", reduce("reduce_sum", powers), ctx.scalar(1 / p, wide))
    return ctx.cast(norm, out)
