"""Opaque `tilefold::` ops that keep attention and linear whole through AOTAutograd.

AOTAutograd decomposes composite ops such as `scaled_dot_product_attention` (into matmuls and a
masked softmax) and `linear` (into flattening views and addmm) before a backend sees them. The
torch.compile backend swaps these calls in Dynamo's graph for the custom ops below, which
AOTAutograd leaves alone; each runs PyTorch's own implementation when left to PyTorch.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


@torch.library.custom_op("tilefold::sdpa", mutates_args=())
def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


@sdpa.register_fake
def _(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # What attention requires, told to the shape environment: a KV cache's keys and values
    # arrive with sizes of their own symbols (PyTorch's CPU kernel never compares them), and
    # these checks make them one symbol, so that the IR can see the lengths agree.
    torch._check(k.shape[-2] == v.shape[-2])
    torch._check(q.shape[-1] == k.shape[-1])
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op("tilefold::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


@linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


SWAPS = {  # Dynamo graph target -> opaque op
    F.scaled_dot_product_attention: torch.ops.tilefold.sdpa.default,
    torch._C._nn.scaled_dot_product_attention: torch.ops.tilefold.sdpa.default,
    F.linear: torch.ops.tilefold.linear.default,
    torch._C._nn.linear: torch.ops.tilefold.linear.default,
}


def preserve(gm: fx.GraphModule) -> int:
    """Swap attention/linear calls in a Dynamo graph for the opaque ops; returns how many.

    A call with a tensor subclass among its arguments (torchao's quantized weights) is left
    alone: the subclass implements the call itself, as its own ops, and knows nothing of ours."""
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in SWAPS and not _subclassed(node):
            node.target = SWAPS[node.target]
            count += 1
    if count:
        gm.recompile()
    return count


def _subclassed(node: fx.Node) -> bool:
    args = [*node.args, *node.kwargs.values()]
    return any(isinstance(a, fx.Node) and is_traceable_wrapper_subclass(a.meta.get("example_value"))
               for a in args)
