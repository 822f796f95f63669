"""The graph IR's `scaled_dot_product_attention` op as the Triton attention template, called on
torch tensors: which ops the template takes (4-D q, k, v of one head dim, no mask tensor) and
the op's attributes (causal, scale, grouped-query heads) as its arguments."""

from __future__ import annotations

from typing import Any

from tilefold.codegen.triton.attention import DTYPES, AttentionSpec
from tilefold.errors import UnsupportedError
from tilefold.ir import Operation

OP = "scaled_dot_product_attention"


def attention_spec(op: Operation, pipelined: bool = True) -> AttentionSpec:
    """The template's spec for `op`, or `UnsupportedError` saying why it cannot take it."""
    if op.name != OP:
        raise UnsupportedError(f"the Triton attention template implements {OP}, not "
                               f"'{op.name}'")
    q, k, v = (x.type for x in op.operands[:3])
    dtype = str(q.dtype)
    where = f"{OP} {q} x {k} x {v}"
    if len(op.operands) > 3:
        raise UnsupportedError(f"{where}: a mask tensor is not in the Triton template (causal "
                               "masks and per-batch key lengths are)")
    if q.rank != 4:
        raise UnsupportedError(f"{where}: the template takes [batch, heads, sequence, dim] "
                               "operands")
    if q.shape[-1] != v.shape[-1]:
        raise UnsupportedError(f"{where}: values with another head dim than the queries' are "
                               "not in the template")
    if dtype not in DTYPES:
        raise UnsupportedError(f"{where}: the template takes {'/'.join(DTYPES)}")
    if q.shape[1] != k.shape[1] and not op.attr("enable_gqa"):
        raise UnsupportedError(f"{where}: {q.shape[1]} query heads on {k.shape[1]} key heads "
                               "need enable_gqa")
    return AttentionSpec(dtype, causal=bool(op.attr("is_causal")), pipelined=pipelined)


class TritonAttentionOp:
    """`op` for a GPU target; call it with torch q, k, v to get the attention output."""

    def __init__(self, op: Operation):
        from tilefold.codegen.triton.attention import TritonAttention

        spec = attention_spec(op)
        self.op = op
        self.attention = TritonAttention(spec.dtype, causal=spec.causal)

    def __call__(self, q: Any, k: Any, v: Any, **launch: Any) -> Any:
        return self.attention(q, k, v, scale=self.op.attr("scale"), **launch)


__all__ = ["OP", "TritonAttentionOp", "attention_spec"]
