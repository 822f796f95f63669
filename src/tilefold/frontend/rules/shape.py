"""Lowering rules for layout ATen ops: views, permutes, expand, slicing, indexing, cat, split."""

from __future__ import annotations

from typing import Any

import torch

from tilefold import dtypes
from tilefold.frontend.context import LoweringContext, Merged
from tilefold.frontend.lowering import NotApplicable, lowering
from tilefold.frontend.symbolic import Composite
from tilefold.ir import Tensor, dims
from tilefold.ir.types import SymDim, dim_sum

aten = torch.ops.aten
END = 2**63 - 1
BEGIN = -(2**63)  # a slice stop meaning "to the beginning" (with a step of -1)


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx: LoweringContext, x: Any, shape: Any) -> Any:
    """reshape; a leading size that is a product of symbolic sizes stays unflattened (Merged);
    sizes whose relation the IR cannot check (a product elsewhere, s0*s1 == s2) are specialized"""
    target = [ctx.size(d) for d in ctx.out().shape]
    src = ctx.value(x)
    base = src.tensor if isinstance(src, Merged) else src
    if not any(isinstance(d, Composite) for d in target):
        if list(base.shape) == target:
            return base
        try:
            return ctx.op("reshape", base, shape=target)
        except NotApplicable:
            ctx.static(*base.shape, *target)
            raise
    if not any(isinstance(d, Composite) for d in target[1:]):
        for lead in range(1, base.ndim + 1):
            if ctx.sizes.same(ctx.sizes.product(base.shape[:lead]), target[0]):
                shape = [*base.shape[:lead], *target[1:]]
                kept = base if list(base.shape) == shape else ctx.op("reshape", base, shape=shape)
                return Merged(kept, lead)
    ctx.static(*base.shape, *target)
    raise NotApplicable(f"view of {base.type} to {[str(d) for d in target]}")


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
    ctx: LoweringContext, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: Any = 1
) -> Any:
    """x[start:end:step] along dim; of a symbolic dim, a gather of an arange (`take`)"""
    t = ctx.tensor(x)
    dim %= t.ndim
    in_size = t.shape[dim]
    out_size = ctx.out_shape()[dim]
    step = ctx.number(step)
    first = 0 if start is None else ctx.size(start)
    stop = END if end is None else ctx.size(end)
    if out_size == in_size and first == 0 and step == 1:
        return t
    if isinstance(first, int) and isinstance(stop, int) and isinstance(in_size, int):
        starts, stops, steps = [0] * t.ndim, [END] * t.ndim, [1] * t.ndim
        starts[dim], stops[dim], steps[dim] = first, stop, step
        return ctx.op("slice", t, starts=starts, stops=stops, steps=steps)
    begin = _first_index(ctx, in_size, out_size, first, stop, step)
    if begin is None:
        ctx.static(in_size, out_size, first, stop)
        raise NotApplicable(f"slice [{first}:{stop}:{step}] of a size-{in_size} dim")
    return take(ctx, t, dim, begin, out_size, step)


def _first_index(ctx: LoweringContext, size: Any, length: Any, start: Any, stop: Any,
                 step: int) -> Any:
    """The index of the first element `[start:stop:step]` takes from a dim of `size`, where
    PyTorch's result `length` tells which of the clamps (a negative bound counts from the end,
    then bounds clamp to [0, size]) applied; None when that is not clear."""
    if length == 0:
        return 0
    if isinstance(start, Composite) or isinstance(stop, Composite):
        return None
    starts = [dim_sum(size, start), 0] if isinstance(start, int) and start < 0 else [start]
    if step != 1:  # the length then is a floor division, which PyTorch left only when static
        return start if isinstance(start, int) and start >= 0 else None
    stops = ([size] if stop == END else
             [dim_sum(size, stop), 0] if isinstance(stop, int) and stop < 0 else [stop, size])
    for s in starts:
        if any(ctx.sizes.same(length, dim_sum(e, -s if isinstance(s, int) else _negated(s)))
               for e in stops):
            return s
    return None


def _negated(d: SymDim) -> SymDim:
    terms, const = dims.parse(d.name) or ({d.name: 1}, 0)
    return SymDim(dims.render({k: -v for k, v in terms.items()}, -const))


def take(ctx: LoweringContext, t: Tensor, dim: int, first: Any, length: Any, step: int = 1
         ) -> Tensor:
    """`length` elements of `t` along `dim` from `first` by `step` >= 1 (sizes: ints or dims):
    a slice where the dim and bounds are numbers, else a gather of an arange (a slice of a
    symbolic dim has no static bounds)."""
    if all(isinstance(v, int) for v in (t.shape[dim], first, length)):
        starts, stops, steps = [0] * t.ndim, [END] * t.ndim, [1] * t.ndim
        starts[dim], stops[dim], steps[dim] = first, first + step * length, step
        return ctx.op("slice", t, starts=starts, stops=stops, steps=steps)
    if isinstance(first, int):
        idx = ctx.op("arange", shape=[length], start=first, step=step)
    else:
        idx = ctx.op("add", ctx.op("arange", shape=[length], step=step), ctx.size_value(first))
    return ctx.op("gather", t, idx, axis=dim)


@lowering(aten.select.int)
def select(ctx: LoweringContext, x: Any, dim: int, index: Any) -> Any:
    """x[..., index, ...]: a slice of one then a squeeze"""
    t = ctx.tensor(x)
    dim %= t.ndim
    size, i = t.shape[dim], ctx.size(index)
    i64 = ctx.dtype(torch.int64)
    if not isinstance(i, int):  # read at run time; a negative one counts from the end
        at = ctx.size_value(i)
        wrapped = ctx.op("add", at, ctx.size_value(size))
        at = ctx.op("where", ctx.op("lt", at, ctx.scalar(0, i64)), wrapped, at)
        return ctx.op("gather", t, at, axis=dim)
    if isinstance(size, SymDim):
        at = ctx.scalar(i, i64) if i >= 0 else ctx.size_value(dim_sum(size, i))
        return ctx.op("gather", t, at, axis=dim)
    starts, stops, steps = [0] * t.ndim, [END] * t.ndim, [1] * t.ndim
    starts[dim], stops[dim] = i % size, i % size + 1
    picked = ctx.op("slice", t, starts=starts, stops=stops, steps=steps)
    return ctx.op("squeeze", picked, axes=[dim])


@lowering(aten.flip.default)
def flip(ctx: LoweringContext, x: Any, dims: list[int]) -> Any:
    """x reversed along dims (cumsum's gradient): a slice with a step of -1 on each"""
    t = ctx.tensor(x)
    if t.ndim == 0:
        return t
    flipped = {d % t.ndim for d in dims}
    starts = [-1 if a in flipped else 0 for a in range(t.ndim)]
    stops = [BEGIN if a in flipped else END for a in range(t.ndim)]
    steps = [-1 if a in flipped else 1 for a in range(t.ndim)]
    return ctx.op("slice", t, starts=starts, stops=stops, steps=steps) if flipped else t


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
    offset: Any = 0
    for piece in ctx.out():
        (n,) = ctx.dims([piece.shape[dim]])
        outs.append(take(ctx, t, dim, offset, n))
        offset = dim_sum(offset, n)
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
    """x with x[i0, i1, ...] = values (a static KV cache's write), or += values with
    accumulate (an embedding's gradient); None entries keep an axis"""
    axes = [i for i, idx in enumerate(indices) if idx is not None]
    tensors = [ctx.tensor(indices[i]) for i in axes]
    if not tensors or any(not t.dtype.is_integer for t in tensors):
        raise NotApplicable("index_put with a boolean mask")
    t = ctx.tensor(x)
    return ctx.op("index_put", t, ctx.operand(values, t.dtype), *tensors, axes=axes,
                  **({"accumulate": True} if accumulate else {}))


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
    dim %= t.ndim
    return ctx.op("index", t, *_grids(ctx, idx, dim), axes=list(range(t.ndim)))


def _grids(ctx: LoweringContext, idx: Tensor, dim: int) -> list[Tensor]:
    """The index arrays of `x[i0, i1, ...]` that take along `dim` where `idx` points: `idx`
    itself on dim, an arange over idx's size on every other axis (gather, scatter)."""
    grids = []
    for axis in range(idx.ndim):
        if axis == dim:
            grids.append(idx)
            continue
        line = ctx.op("arange", shape=[idx.shape[axis]])
        others = [a for a in range(idx.ndim) if a != axis]
        grids.append(ctx.op("expand_dims", line, axes=others) if others else line)
    return grids


@lowering(aten.scatter_add.default)
def scatter_add(ctx: LoweringContext, x: Any, dim: int, index: Any, src: Any) -> Any:
    """x with src[i] added at x[..., index[i], ...] along dim, repeats summed (gather's
    gradient): an accumulating index_put with gather's grids (index on dim, aranges
    elsewhere); src's part of the index's shape is used, as PyTorch's"""
    t, idx, values = ctx.tensor(x), ctx.tensor(index), ctx.tensor(src)
    if t.ndim == 0:  # index and src 0-d or one long: the one element, as a [1] tensor
        one = [_at_least_1d(ctx, v) for v in (t, idx, values)]
        summed = ctx.op("index_put", one[0], ctx.cast(one[2], t.dtype), one[1], axes=[0],
                        accumulate=True)
        return ctx.op("reshape", summed, shape=[])
    rank = t.ndim
    dim %= rank
    if values.shape != idx.shape:
        if not all(isinstance(d, int) for d in (*values.shape, *idx.shape)):
            raise NotApplicable("scatter_add: src larger than the index, of symbolic size")
        values = ctx.op("slice", values, starts=[0] * rank, stops=list(idx.shape),
                        steps=[1] * rank)
    return ctx.op("index_put", t, ctx.cast(values, t.dtype), *_grids(ctx, idx, dim),
                  axes=list(range(rank)), accumulate=True)


@lowering(aten.slice_scatter.default)
def slice_scatter(ctx: LoweringContext, x: Any, src: Any, dim: int = 0, start: Any = None,
                  end: Any = None, step: Any = 1) -> Any:
    """x with x[start:end:step] along dim replaced by src (slice's gradient): x's slices
    around src concatenated for static bounds and a step of 1, an index_put at an arange of
    positions for another step; of a symbolic dim, src gathered at each position's offset
    from start and a where over the positions it covers"""
    t, values = ctx.tensor(x), ctx.tensor(src)
    dim %= t.ndim
    size, step = t.shape[dim], ctx.number(step)
    first = None if start is None else ctx.size(start)
    stop = None if end is None else ctx.size(end)
    values = ctx.cast(values, t.dtype)
    if not all(isinstance(v, int | None) for v in (size, first, stop, step)):
        return _symbolic_slice_scatter(ctx, t, values, dim, first, step)
    picked = range(size)[slice(first, stop, step)]
    if len(picked) == 0:
        return t
    if step != 1:
        at = ctx.op("arange", shape=[len(picked)], start=picked[0], step=step)
        return ctx.op("index_put", t, values, at, axes=[dim])
    parts = [take(ctx, t, dim, 0, picked[0])] if picked[0] else []
    parts.append(values)
    if picked[-1] + 1 < size:
        parts.append(take(ctx, t, dim, picked[-1] + 1, size - picked[-1] - 1))
    return parts[0] if len(parts) == 1 else ctx.op("concat", *parts, axis=dim)


def _symbolic_slice_scatter(ctx: LoweringContext, t: Tensor, values: Tensor, dim: int,
                            first: Any, step: Any) -> Tensor:
    if step != 1:
        raise NotApplicable(f"slice_scatter of a symbolic dim by a step of {step}")
    if isinstance(first, int) and first < 0:  # counts from the end
        first = dim_sum(t.shape[dim], first)
    length = values.shape[dim]
    if length == 0:
        return t
    i64 = dtypes.i64
    zero = ctx.scalar(0, i64)
    count = ctx.size_value(length)
    offset = ctx.op("sub", ctx.op("arange", shape=[t.shape[dim]]), ctx.size_value(first or 0))
    inside = ctx.op("and", ctx.op("ge", offset, zero), ctx.op("lt", offset, count))
    at = ctx.op("min", ctx.op("max", offset, zero), ctx.op("sub", count, ctx.scalar(1, i64)))
    taken = ctx.op("gather", values, at, axis=dim)
    others = [a for a in range(t.ndim) if a != dim]
    mask = ctx.op("expand_dims", inside, axes=others) if others else inside
    return ctx.op("where", mask, taken, t)


F32_EXACT = 1 << 24  # every integer up to this is an f32 (an index above it is out of range)


@lowering(aten.scatter.value, aten.scatter.src)
def scatter(ctx: LoweringContext, x: Any, dim: int, index: Any, value: Any) -> Any:
    """x with x[..., index[i], ...] = value (or src[i]) along dim. For an index one long on
    dim and x's size elsewhere (nll_loss's backward marks each row's target class, max.dim's
    its position): a compare of the index with an arange along dim, then where; else an
    index_put at gather's grids (where the index repeats a position, one write wins: PyTorch
    leaves which unspecified)"""
    t, idx = ctx.tensor(x), ctx.tensor(index)
    if t.ndim == 0:  # the index names the one element
        return ctx.operand(value, t.dtype)
    dim %= t.ndim
    if (idx.ndim != t.ndim or idx.shape[dim] != 1
            or not all(ctx.sizes.same(a, b) for i, (a, b) in
                       enumerate(zip(idx.shape, t.shape, strict=True)) if i != dim)):
        return _scattered(ctx, t, dim, idx, value)
    size = t.shape[dim]
    if isinstance(size, int) and size <= F32_EXACT:  # positions compare exactly as f32, so
        # the compare fuses with the f32 work around it (kernels compute in f32)
        line = ctx.op("arange", shape=[size], dtype=dtypes.f32)
        idx = ctx.op("cast", idx, dtype=dtypes.f32)
    else:
        line = ctx.op("arange", shape=[size], dtype=idx.dtype)
    axes = [a for a in range(t.ndim) if a != dim]
    hit = ctx.op("eq", ctx.op("expand_dims", line, axes=axes) if axes else line, idx)
    if isinstance(value, bool | int | float):
        return ctx.op("where", hit, ctx.operand(value, t.dtype), t)
    src = ctx.tensor(value)  # scatter.src: src[i] lands where index[i] points
    if src.shape != idx.shape:
        raise NotApplicable("scatter: src must have the index's shape")
    return ctx.op("where", hit, ctx.operand(value, t.dtype), t)


def _scattered(ctx: LoweringContext, t: Tensor, dim: int, idx: Tensor, value: Any) -> Tensor:
    """scatter as an index_put: a value, or the part of src of the index's shape"""
    if idx.ndim != t.ndim:
        raise NotApplicable("scatter: the index must have x's rank")
    if isinstance(value, bool | int | float):
        values = ctx.operand(value, t.dtype)
    else:
        values = ctx.tensor(value)
        if values.shape != idx.shape:
            if not all(isinstance(d, int) for d in (*values.shape, *idx.shape)):
                raise NotApplicable("scatter: src larger than the index, of symbolic size")
            values = ctx.op("slice", values, starts=[0] * t.ndim, stops=list(idx.shape),
                            steps=[1] * t.ndim)
        values = ctx.cast(values, t.dtype)
    return ctx.op("index_put", t, values, *_grids(ctx, idx, dim), axes=list(range(t.ndim)))


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx: LoweringContext, x: Any, pad: list[int], value: Any = 0) -> Any:
    """x padded with `value` (pairs of before/after counts from the last dim backward; a
    negative count cuts): slices, and concats with filled blocks (GPT-2's shifted labels)"""
    t = ctx.tensor(x)
    pad = [ctx.number(p) for p in pad]  # dynamic=True hands them in as SymInts: specialized
    if len(pad) % 2 or len(pad) // 2 > t.ndim or not all(isinstance(p, int) for p in pad):
        raise NotApplicable(f"constant_pad_nd with pads {pad}")
    for k in range(len(pad) // 2):
        dim, before, after = t.ndim - 1 - k, pad[2 * k], pad[2 * k + 1]
        if before < 0 or after < 0:
            size = t.shape[dim]
            if not isinstance(size, int):
                raise NotApplicable("a negative pad of a symbolic dim")
            first = max(0, -before)
            t = take(ctx, t, dim, first, size - first - max(0, -after))
        parts = []
        for count in (max(0, before), None, max(0, after)):
            if count is None:
                parts.append(t)
            elif count:
                shape = [*t.shape[:dim], count, *t.shape[dim + 1:]]
                parts.append(ctx.op("broadcast_to", ctx.operand(value, t.dtype), shape=shape))
        t = parts[0] if len(parts) == 1 else ctx.op("concat", *parts, axis=dim)
    return t
