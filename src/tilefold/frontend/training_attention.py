"""Attention in a training graph, as flash attention keeps it: the forward saves the
query, key, value and one log-sum-exp per query row, and the backward recomputes the
probabilities from them, rather than saving the probabilities (batch x heads x L x S
floats: 37.7 MB of MiniLM's 8 x 128 step, more than all its other attention activations).

PyTorch traces `scaled_dot_product_attention` on CPU tensors as
`_scaled_dot_product_flash_attention_for_cpu`, whose autograd formula saves those tensors
and the output and calls `_scaled_dot_product_flash_attention_for_cpu_backward`. In float32
(every shape the fused kernels take: up to two batch dims) each is one opaque op,
`tilefold::attention_forward` (the output and the log-sum-exp) and
`tilefold::attention_backward`, which the rules lower to the IR's ops of those names and the
fused kernels run: the scores, probabilities and their gradients stay in cache, block by block,
and are never written out. The backward takes each row's <dO, O> as `delta` (a [B, H, L] sum
here), so the forward's output is saved too (B x H x L x Ev, a 32nd of MiniLM's
probabilities).

In other dtypes both are decomposed here into the matmuls, reductions and elementwise ops the
rules lower (PyTorch's own decomposition of the forward returns the probabilities in place of
the log-sum-exp, which an export needs and a backward cannot use). That backward works on the
transposed scores (key rows by query rows): the recomputed probabilities are then never the
very expression the forward computed, which common-subexpression elimination would merge into
one value, saved again. It reads no output either (each row's <dO, O> is <P, dP>), so the
partitioner saves none: the projection after attention keeps its own copy of it.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _bias(mask: torch.Tensor | None, is_causal: bool, q: torch.Tensor, k: torch.Tensor
          ) -> torch.Tensor | None:
    """The additive bias of the scores (L x S, broadcast): the mask's (a bool mask keeps
    True) and the causal one's (query i sees keys 0..i, as PyTorch aligns it)."""
    bias = None
    if mask is not None:
        bias = mask if mask.dtype != torch.bool else torch.where(
            mask, torch.zeros((), dtype=q.dtype), torch.full((), -math.inf, dtype=q.dtype))
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        causal = torch.where(keep, torch.zeros((), dtype=q.dtype),
                             torch.full((), -math.inf, dtype=q.dtype))
        bias = causal if bias is None else bias + causal
    return bias


def _heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Grouped-query key/value heads repeated to the query's."""
    groups = q.shape[1] // kv.shape[1]
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def _grouped(grad: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """A repeated head's gradient summed back over the query heads that shared it."""
    b, h, s, e = grad.shape
    heads = kv.shape[1]
    return grad if heads == h else grad.reshape(b, heads, h // heads, s, e).sum(2)


@torch.library.custom_op("tilefold::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      bias: torch.Tensor | None = None, scale: float | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The IR's `attention_forward` in PyTorch (where the graph is left to it): the output and
    each query row's log-sum-exp (-inf, and zeros out, where the bias masks the row whole)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, -1)
    probs = torch.nan_to_num(torch.exp(scores - lse.unsqueeze(-1)), nan=0.0)
    return torch.matmul(probs, v), lse


@attention_forward.register_fake
def _(q, k, v, bias=None, scale=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1])


def flash_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  dropout_p: float = 0.0, is_causal: bool = False, *,
                  attn_mask: torch.Tensor | None = None, scale: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp of each query row's scaled scores, in f32 at least)."""
    if dropout_p:
        raise RuntimeError("flash attention on CPU takes no dropout")  # PyTorch picks math
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    k, v = _heads(query, key), _heads(query, value)
    bias = _bias(attn_mask, is_causal, query, key)
    if _fused(query):
        return attention_forward(query, k, v, bias, scale)
    scores = torch.matmul(query, k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    top = torch.amax(scores, -1, keepdim=True)
    weights = torch.exp(scores - top)
    total = torch.sum(weights, -1, keepdim=True)
    out = torch.matmul(weights, v) / total
    lse = (top + torch.log(total)).squeeze(-1)
    return out, lse.to(torch.promote_types(query.dtype, torch.float32))


@torch.library.custom_op("tilefold::attention_backward", mutates_args=())
def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       lse: torch.Tensor, delta: torch.Tensor, bias: torch.Tensor | None = None,
                       scale: float | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The IR's `attention_backward` in PyTorch (where the graph is left to it): the grads of
    q, k, v from each query row's log-sum-exp `lse` and <dout, out> `delta`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    probs = torch.nan_to_num(torch.exp(scores - lse.unsqueeze(-1)), nan=0.0)
    grad_scores = probs * (torch.matmul(dout, v.transpose(-2, -1)) - delta.unsqueeze(-1)) * scale
    return (torch.matmul(grad_scores, k), torch.matmul(grad_scores.transpose(-2, -1), q),
            torch.matmul(probs.transpose(-2, -1), dout))


@attention_backward.register_fake
def _(dout, q, k, v, lse, delta, bias=None, scale=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def flash_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                   dropout_p: float, is_causal: bool, *, attn_mask: torch.Tensor | None = None,
                   scale: float | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad of query, key, value), the probabilities recomputed, transposed, from the
    log-sum-exp."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    k, v = _heads(query, key), _heads(query, value)
    bias = _bias(attn_mask, is_causal, query, key)
    if _fused(query):
        delta = torch.sum(grad_out * out, -1)
        grad_q, grad_k, grad_v = attention_backward(grad_out, query, k, v, logsumexp, delta,
                                                    bias, scale)
        return grad_q, _grouped(grad_k, key), _grouped(grad_v, value)
    scores_t = torch.matmul(k, query.transpose(-2, -1)) * scale  # keys x queries
    if bias is not None:
        scores_t = scores_t + bias.transpose(-2, -1)
    probs_t = torch.exp(scores_t - logsumexp.to(query.dtype).unsqueeze(-2))
    grad_v = torch.matmul(probs_t, grad_out)
    grad_probs_t = torch.matmul(v, grad_out.transpose(-2, -1))
    # each query row's <dO, O> as <P, dP> (the same sum: O = P V, dP = dO V^T): the output
    # itself is then not saved for the backward (the attention's projection saves its own
    # copy, laid out by tokens)
    row = torch.sum(probs_t * grad_probs_t, -2, keepdim=True)
    grad_scores_t = probs_t * (grad_probs_t - row) * scale
    grad_k = torch.matmul(grad_scores_t, query)
    grad_q = torch.matmul(grad_scores_t.transpose(-2, -1), k)
    return grad_q, _grouped(grad_k, key), _grouped(grad_v, value)


def _fused(query: torch.Tensor) -> bool:
    """Whether the fused kernels take attention on `query`: float32, at most two batch dims."""
    return query.dtype == torch.float32 and query.dim() <= 4


def decompositions() -> dict:
    """The training table's entries for the CPU flash-attention op and its backward."""
    return {aten._scaled_dot_product_flash_attention_for_cpu.default: flash_forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default: flash_backward}
