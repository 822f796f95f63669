"""Lowering rules for layout ATen ops: views, permutes, expand, slicing, indexing, cat, split."""

from __future__ import annotations

from typing import Any

import torch

from tilefold.frontend.context import LoweringContext, Merged
from tilefold.frontend.lowering import NotApplicable, lowering
from tilefold.frontend.symbolic import Composite
from tilefold.ir import Tensor
from tilefold.ir.types import SymDim, dim_sum

aten = torch.ops.aten
END = 2**63 - 1


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx: LoweringContext, x: Any, shape: Any) -> Any:
    """reshape; a leading size that is a product of symbolic sizes stays unflattened (Merged)"""
    target = [ctx.size(d) for d in ctx.out().shape]
    src = ctx.value(x)
    base = src.tensor if isinstance(src, Merged) else src
    if not any(isinstance(d, Composite) for d in target):
        return base if list(base.shape) == target else ctx.op("reshape", base, shape=target)
    if any(isinstance(d, Composite) for d in target[1:]):
        raise NotApplicable(f"view to {[str(d) for d in target]}: only a leading merged size")
    for lead in range(1, base.ndim + 1):
        if ctx.sizes.same(ctx.sizes.product(base.shape[:lead]), target[0]):
            shape = [*base.shape[:lead], *target[1:]]
            kept = base if list(base.shape) == shape else ctx.op("reshape", base, shape=shape)
            return Merged(kept, lead)
    raise NotApplicable(f"view: {target[0]} is not a product of leading dims of {base.type}")


@lowering(aten.permute.default)
def permute(ctx: LoweringContext, x: Any, dims: list[int]) -> Any:
    """transpose by a permutation (a merged leading dim may stay in place)"""
    rank = ctx.rank(x)
    perm = [d % rank for d in dims] if rank else []
    return _transpose(ctx, x, perm)


@lowering(aten.transpose.int)
def transpose(ctx: LoweringContext, x: Any, dim0: int, dim1: int) -> Any:
    """swap two axes"""
    rank = ctx.rank(x)
    perm = list(range(rank))
    if rank:
        perm[dim0 % rank], perm[dim1 % rank] = perm[dim1 % rank], perm[dim0 % rank]
    return _transpose(ctx, x, perm)


@lowering(aten.t.default)
def t(ctx: LoweringContext, x: Any) -> Any:
    """2-D transpose (identity below rank 2)"""
    return _transpose(ctx, x, list(reversed(range(ctx.rank(x)))))


def _transpose(ctx: LoweringContext, x: Any, perm: list[int]) -> Any:
    src = ctx.value(x)
    if perm == sorted(perm):
        return src
    if isinstance(src, Merged):
        if perm[0] != 0:
            raise NotApplicable("permute moves a merged symbolic dim")
        lead = src.lead
        full = [*range(lead), *(p + lead - 1 for p in perm[1:])]
        return Merged(ctx.op("transpose", src.tensor, perm=full), lead)
    return ctx.op("transpose", src, perm=perm)


@lowering(aten.expand.default)
def expand(ctx: LoweringContext, x: Any, size: Any, *, implicit: bool = False) -> Any:
    """broadcast_to the result shape"""
    t = ctx.tensor(x)
    shape = ctx.out_shape()
    return t if tuple(t.shape) == shape else ctx.op("broadcast_to", t, shape=shape)


@lowering(aten.unsqueeze.default)
def unsqueeze(ctx: LoweringContext, x: Any, dim: int) -> Any:
    """insert a unit dim"""
    return ctx.op("expand_dims", ctx.tensor(x), axes=[dim % (ctx.rank(x) + 1)])


@lowering(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx: LoweringContext, x: Any, dims: Any = None) -> Any:
    """drop the named unit dims (PyTorch ignores named dims that are not 1)"""
    t = ctx.tensor(x)
    rank = t.ndim
    wanted = range(rank) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = sorted({d % rank for d in wanted if t.shape[d % rank] == 1}) if rank else []
    return ctx.op("squeeze", t, axes=axes) if axes else t


@lowering(aten.slice.Tensor)
def slice_(
    ctx: LoweringContext, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Any:
    """x[start:end:step] along dim; a symbolic result length becomes a gather of an arange"""
    t = ctx.tensor(x)
    dim %= t.ndim
    in_size = t.shape[dim]
    out_size = ctx.out_shape()[dim]
    first = 0 if start is None else ctx.size(start)
    stop = END if end is None else ctx.size(end)
    if out_size == in_size and first == 0 and step == 1:
        return t
    if isinstance(first, int) and isinstance(stop, int) and isinstance(in_size, int):
        starts, stops, steps = [0] * t.ndim, [END] * t.ndim, [1] * t.ndim
        starts[dim], stops[dim], steps[dim] = first, stop, step
        return ctx.op("slice", t, starts=starts, stops=stops, steps=steps)
    if step > 0 and not isinstance(first, Composite):
        if isinstance(first, int) and first < 0:  # the last elements of a symbolic dim
            if stop != END or step != 1:
                raise NotApplicable(f"slice [{first}:{stop}:{step}] of a size-{in_size} dim")
            if out_size == in_size:  # the start clamps to 0 (PyTorch knows the sizes)
                return t
            if not isinstance(out_size, int):
                raise NotApplicable(f"slice [{first}:] of a size-{in_size} dim")
            first = dim_sum(in_size, -out_size)
        if isinstance(first, int):
            idx = ctx.op("arange", shape=[out_size], start=first, step=step)
        else:
            idx = ctx.op("add", ctx.op("arange", shape=[out_size], step=step),
                         ctx.size_value(first))
        return ctx.op("gather", t, idx, axis=dim)
    raise NotApplicable(f"slice [{first}:{stop}:{step}] of a size-{in_size} dim")


@lowering(aten.select.int)
def select(ctx: LoweringContext, x: Any, dim: int, index: Any) -> Any:
    """x[..., index, ...]: a slice of one then a squeeze"""
    t = ctx.tensor(x)
    dim %= t.ndim
    size, i = t.shape[dim], ctx.size(index)
    if not isinstance(i, int) or (i < 0 and not isinstance(size, int)):
        raise NotApplicable(f"select index {i} on a dim of size {size}")
    if isinstance(size, SymDim):
        return ctx.op("gather", t, ctx.scalar(i, ctx.dtype(torch.int64)), axis=dim)
    starts, stops, steps = [0] * t.ndim, [END] * t.ndim, [1] * t.ndim
    starts[dim], stops[dim] = i % size, i % size + 1
    picked = ctx.op("slice", t, starts=starts, stops=stops, steps=steps)
    return ctx.op("squeeze", picked, axes=[dim])


@lowering(aten.cat.default)
def cat(ctx: LoweringContext, tensors: list[Any], dim: int = 0) -> Any:
    """concat (PyTorch's legacy empty 1-D operands are dropped)"""
    rank = ctx.out().dim()
    parts = [ctx.tensor(a) for a in tensors if ctx.meta(a).dim() == rank]
    parts = [p for p in parts if not (p.ndim == 1 and p.shape[0] == 0)] or parts
    return parts[0] if len(parts) == 1 else ctx.op("concat", *parts, axis=dim % rank)


@lowering(aten.split.Tensor, aten.split_with_sizes.default)
def split(ctx: LoweringContext, x: Any, sizes: Any, dim: int = 0) -> list[Tensor]:
    """consecutive slices along dim"""
    t = ctx.tensor(x)
    dim %= t.ndim
    outs = []
    offset = 0
    for piece in ctx.out():
        n = ctx.size(piece.shape[dim])
        if not isinstance(n, int):
            raise NotApplicable("split into pieces of symbolic size")
        starts, stops, steps = [0] * t.ndim, [END] * t.ndim, [1] * t.ndim
        starts[dim], stops[dim] = offset, offset + n
        outs.append(ctx.op("slice", t, starts=starts, stops=stops, steps=steps))
        offset += n
    return outs


@lowering(aten.index.Tensor)
def index(ctx: LoweringContext, x: Any, indices: list[Any]) -> Any:
    """advanced indexing x[i0, i1, ...] (None entries keep an axis whole)"""
    axes = [i for i, idx in enumerate(indices) if idx is not None]
    tensors = [ctx.tensor(indices[i]) for i in axes]
    if any(not t.dtype.is_integer for t in tensors):
        raise NotApplicable("boolean-mask indexing")
    return ctx.op("index", ctx.tensor(x), *tensors, axes=axes)


@lowering(aten.index_put.default)
def index_put(ctx: LoweringContext, x: Any, indices: list[Any], values: Any,
              accumulate: bool = False) -> Any:
    """x with x[i0, i1, ...] = values (a static KV cache's write); None entries keep an axis"""
    if accumulate:
        raise NotApplicable("index_put with accumulate=True")
    axes = [i for i, idx in enumerate(indices) if idx is not None]
    tensors = [ctx.tensor(indices[i]) for i in axes]
    if not tensors or any(not t.dtype.is_integer for t in tensors):
        raise NotApplicable("index_put with a boolean mask")
    t = ctx.tensor(x)
    return ctx.op("index_put", t, ctx.operand(values, t.dtype), *tensors, axes=axes)


@lowering(aten.index_select.default)
def index_select(ctx: LoweringContext, x: Any, dim: int, idx: Any) -> Any:
    """rows along dim picked by a 1-D index (a 0-d x gives a 0-d result)"""
    t = ctx.tensor(x)
    picked = ctx.op("gather", _at_least_1d(ctx, t), ctx.tensor(idx), axis=dim)
    return ctx.op("reshape", picked, shape=[]) if t.ndim == 0 else picked


def _at_least_1d(ctx: LoweringContext, t: Tensor) -> Tensor:
    """A 0-d tensor as shape [1] (PyTorch's dim 0 or -1 of a 0-d tensor is that one element)."""
    return ctx.op("reshape", t, shape=[1]) if t.ndim == 0 else t


@lowering(aten.embedding.default)
def embedding(ctx: LoweringContext, weight: Any, indices: Any, *args: Any) -> Any:
    """table lookup: gather rows of the weight"""
    return ctx.op("gather", ctx.tensor(weight), ctx.tensor(indices), axis=0)


@lowering(aten.gather.default)
def gather(ctx: LoweringContext, x: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    """torch.gather (take along dim): advanced indexing with an arange on every other axis"""
    t, idx = ctx.tensor(x), ctx.tensor(index)
    if t.ndim == 0:  # idx is 0-d or [1] and picks the one element
        return ctx.op("gather", _at_least_1d(ctx, t), idx, axis=0)
    rank = t.ndim
    dim %= rank
    grids = []
    for axis in range(rank):
        if axis == dim:
            grids.append(idx)
            continue
        line = ctx.op("arange", shape=[idx.shape[axis]])
        others = [a for a in range(rank) if a != axis]
        grids.append(ctx.op("expand_dims", line, axes=others) if others else line)
    return ctx.op("index", t, *grids, axes=list(range(rank)))
