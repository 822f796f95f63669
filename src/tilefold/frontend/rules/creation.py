"""Lowering rules for tensor-creating ATen ops: arange, full/zeros/ones (and their _like forms)."""

from __future__ import annotations

from typing import Any

import torch

from tilefold.frontend.context import LoweringContext
from tilefold.frontend.lowering import NotApplicable, lowering

aten = torch.ops.aten


@lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """start + step * i; the length comes from PyTorch's (possibly symbolic) result shape, a
    symbolic start is added at run time, a symbolic step is specialized"""
    start = args[0] if len(args) >= 2 else kwargs.get("start", 0)
    step = ctx.number(args[2] if len(args) == 3 else kwargs.get("step", 1))
    shape, dtype = ctx.out_shape(), ctx.out_dtype()
    first = start if isinstance(start, float) else ctx.size(start)
    if isinstance(first, int | float):
        return ctx.op("arange", shape=shape, start=first, step=step, dtype=dtype)
    line = ctx.op("arange", shape=shape, step=step, dtype=dtype)
    return ctx.op("add", line, ctx.operand(start, dtype))


def _filled(ctx: LoweringContext, value: Any) -> Any:
    """A scalar (a SymInt, with dynamic=True: read at run time) broadcast to the result shape."""
    if not isinstance(value, bool | int | float | torch.fx.Node):
        raise NotApplicable(f"fill value {value!r}")
    scalar = ctx.operand(value, ctx.out_dtype())
    shape = ctx.out_shape()
    return ctx.op("broadcast_to", scalar, shape=shape) if shape else scalar


@lowering(aten.full.default)
def full(ctx: LoweringContext, size: Any, fill_value: Any, **kwargs: Any) -> Any:
    """a filled tensor"""
    return _filled(ctx, fill_value)


@lowering(aten.full_like.default, aten.new_full.default)
def full_like(ctx: LoweringContext, x: Any, *args: Any, **kwargs: Any) -> Any:
    """a filled tensor shaped like x (new_full: of the given size)"""
    return _filled(ctx, args[-1] if args else kwargs["fill_value"])


@lowering(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default)
def zeros(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """zeros of the result shape"""
    return _filled(ctx, 0)


@lowering(aten.empty.memory_format, aten.empty_like.default, aten.empty_permuted.default)
def empty(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """an uninitialized tensor, as zeros (autograd's silu backward fills one with full_like)"""
    return _filled(ctx, 0)


@lowering(aten.new_empty_strided.default, aten.empty_strided.default)
def empty_strided(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """an uninitialized tensor with contiguous strides, as zeros (compiled autograd's
    AccumulateGrad makes a parameter's first `.grad` so, then copies the gradient in); other
    strides stay with PyTorch (the IR's results are contiguous)"""
    val = ctx.node.meta.get("val") if ctx.node is not None else None
    if not isinstance(val, torch.Tensor) or not val.is_contiguous():
        raise NotApplicable("strides other than contiguous")
    return _filled(ctx, 0)


@lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """ones of the result shape"""
    return _filled(ctx, 1)


@lowering(aten.scalar_tensor.default)
def scalar_tensor(ctx: LoweringContext, value: Any, **kwargs: Any) -> Any:
    """a 0-d tensor"""
    return _filled(ctx, value)


@lowering(aten.tril.default, aten.triu.default)
def triangle(ctx: LoweringContext, x: Any, diagonal: int = 0) -> Any:
    """keep x where col - row <= diagonal (tril) or >= diagonal (triu), else 0"""
    t = ctx.tensor(x)
    rows = ctx.op("expand_dims", ctx.op("arange", shape=[t.shape[-2]]), axes=[1])
    cols = ctx.op("arange", shape=[t.shape[-1]])
    offset = ctx.op("sub", cols, rows)
    cmp = "le" if ctx.node.target is aten.tril.default else "ge"
    keep = ctx.op(cmp, offset, ctx.operand(diagonal, offset.dtype))
    return ctx.op("where", keep, t, ctx.scalar(0, t.dtype))
