"""Lowering rule for in-place state: a graph input written back (functionalization's `copy_`).

AOTAutograd, keeping inference input mutations in the graph, ends it with `copy_(input, new)`
for each input the program wrote (a static KV cache, a position counter). The IR has value
semantics: the new value becomes an extra result, recorded in `ctx.mutations`, which the
runner writes back into the caller's tensor, or which the compiled graph writes in place when
it can (`Converted.mutations`, `CompiledGraph`'s `donate`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from tilefold.frontend.context import LoweringContext
from tilefold.frontend.lowering import NotApplicable, lowering

aten = torch.ops.aten


@lowering(aten.copy_.default)
def copy_(ctx: LoweringContext, dst: Any, src: Any, non_blocking: bool = False) -> Any:
    """a graph input's new value: src as dst's dtype and shape, written back after the call"""
    if not isinstance(dst, fx.Node) or dst.op != "placeholder":
        raise NotApplicable("copy_ into a tensor that is not a graph input")
    target = ctx.tensor(dst)
    if target.value not in ctx.b.function.args:
        raise NotApplicable(f"copy_ into {dst.name}, a weight frozen as a constant")
    order = {n: i for i, n in enumerate(dst.graph.nodes)}
    if any(order[user] > order[ctx.node] for user in dst.users):
        raise NotApplicable(f"{dst.name} is read after copy_ writes it")
    value = ctx.operand(src, target.dtype)
    if tuple(value.shape) != tuple(target.shape):
        value = ctx.op("broadcast_to", value, shape=list(target.shape))
    ctx.mutations[dst] = value
    return value


@lowering(aten.copy.default)
def copy(ctx: LoweringContext, dst: Any, src: Any, non_blocking: bool = False) -> Any:
    """functionalization's out-of-place copy: src as dst's dtype and shape (dst's values are
    not read)"""
    target = ctx.tensor(dst)
    value = ctx.operand(src, target.dtype)
    if tuple(value.shape) != tuple(target.shape):
        value = ctx.op("broadcast_to", value, shape=list(target.shape))
    return value
