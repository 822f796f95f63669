"""The Triton fused-attention template: softmax(Q K^T * scale + mask) V in one pass over key and
value blocks (online softmax), with causal and key-padding masks and grouped-query heads.

`tf_attention` computes BLOCK_M query rows of one (batch, head) per program: grid axis 0 is
batch x heads, axis 1 the query blocks, the heaviest first when causal (the last block sees
the most keys). For each block of BLOCK_N keys it forms the scores with the matrix units,
scaled by scale log2(e) so that e^x is one `exp2`, and folds them into a running row maximum
m, row sum l and output accumulator: with m' = max(m, max_j s_j), acc = acc 2^(m - m') +
2^(s - m') V and l = l 2^(m - m') + sum_j 2^(s_j - m') (every argument <= 0, where the fast
exp2 is accurate to a few ulp of a result at most 1). The key blocks every query row of the
program sees in full (below the diagonal when causal, and short of the key length) run in a
first loop without masks; the rest, the diagonal block(s) and the key tail, in a second loop
that masks keys past the row's sequence length and, when causal, past the query's position
(query i sees keys j <= i, the top-left alignment of PyTorch's `is_causal`). The output is
acc / l, and zeros for a row that sees no key, as the graph IR's
`scaled_dot_product_attention` and PyTorch give. Query head h reads key/value head
h // (Hq / Hkv) (grouped-query attention; Hq == Hkv is plain multi-head). The head dim is a
power-of-two tile of at least 16, masked down to the real D.

The row reductions are `tl.reduce` over the file's own combine helpers, since generated
kernels call no `@triton.jit` function of Triton's library (`tl.max`, `tl.sum`). As in the
GEMM template, `pipelined=False` writes the key loops as `while` loops for Triton 3.6's
interpreter; the probabilities go to the second dot in V's dtype (f32 operands use IEEE
products, no TF32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefold.codegen.triton.launch import interpreting, load_jit, widened_f32
from tilefold.codegen.triton.math import HELPERS
from tilefold.errors import ShapeError, UnsupportedError

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
MAX_GRID_Y = 65535  # programs along a CUDA grid's axis 1 (the query blocks here)
KERNEL = "tf_attention"


@dataclass(frozen=True)
class AttentionSpec:
    """What one generated attention kernel computes: operand dtype, whether it is causal,
    whether a per-batch key length masks padding, and the loop form (see the header)."""

    dtype: str
    causal: bool = False
    padded: bool = False
    pipelined: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UnsupportedError(f"Triton attention: q, k, v must be one of "
                                   f"{', '.join(DTYPES)}, not {self.dtype}")


PARAMS = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "len_ptr", "SQ", "SK", "D", "HQ", "GROUP",
          "scale", "sq_b", "sq_h", "sq_s", "sq_d", "sk_b", "sk_h", "sk_s", "sk_d",
          "sv_b", "sv_h", "sv_s", "sv_d", "so_b", "so_h", "so_s", "so_d")
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "HEAD_D")


def _key_block(spec: AttentionSpec, masked: bool) -> str:
    """The body of a key loop over blocks at `n0`: scores in base 2 (log2 e folded into the
    scale), masked only in the loop over blocks that need it."""
    precision = ', input_precision="ieee"' if spec.dtype == "f32" else ""
    n_mask = " & n_mask[None, :]" if masked else ""
    lines = ["rn = n0 + tl.arange(0, BLOCK_N)",
             *(["n_mask = rn < kv_len"] if masked else []),
             f"kt = tl.load(k_base + rn[None, :] * sk_s, mask=d_mask[:, None]{n_mask}, "
             "other=0)",
             f"s = tl.dot(q, kt{precision}) * qk_scale"]
    if masked:
        valid = "n_mask[None, :]" + (" & (rn[None, :] <= rm[:, None])  # query i sees keys j <= i"
                                     if spec.causal else "")
        lines += [f"valid = {valid}", "s = tl.where(valid, s, -_TF_INF)"]
    v_mask = "n_mask[:, None] & d_mask[None, :]" if masked else "d_mask[None, :]"
    lines += ["m_new = _tf_max(m_i, tl.reduce(s, 1, _tf_max))",
              "m_use = tl.where(m_new == -_TF_INF, 0.0, m_new)  # a row with no key yet: no NaN",
              "alpha = tl.exp2(m_i - m_use)",
              "p = tl.exp2(s - m_use[:, None])",
              "l_i = l_i * alpha + tl.reduce(p, 1, _tf_add)",
              f"v = tl.load(v_base + rn[:, None] * sv_s, mask={v_mask}, other=0)",
              f"acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v{precision})",
              "m_i = m_new"]
    return "".join(f"        {line}\n" for line in lines)


def _key_loop(spec: AttentionSpec, start: str, stop: str, masked: bool) -> str:
    """A loop over key blocks from `start` below `stop` (a `while` loop for the interpreter,
    which cannot range() over a run-time bound)."""
    body = _key_block(spec, masked)
    if spec.pipelined:
        return f"    for n0 in range({start}, {stop}, BLOCK_N):\n{body}"
    return (f"    n0 = {start}\n    while n0 < {stop}:\n{body}"
            "        n0 += BLOCK_N\n")


def emit_attention(spec: AttentionSpec) -> str:
    """The Python source of a module defining `tf_attention` for `spec`."""
    length = "tl.load(len_ptr + b)" if spec.padded else "SK"
    if spec.causal:  # the last query blocks see the most keys: they start first
        pid_m = "(SQ + BLOCK_M - 1) // BLOCK_M - 1 - tl.program_id(1)"
        end = "tl.minimum(kv_len, (pid_m + 1) * BLOCK_M)"
        full = "tl.minimum(pid_m * BLOCK_M, kv_len)"  # keys every query row of the block sees
    else:
        pid_m, end, full = "tl.program_id(1)", "kv_len", "kv_len"
    header = "".join([*(f"    {p},\n" for p in PARAMS),
                      *(f"    {c}: tl.constexpr,\n" for c in CONSTEXPRS)])
    body = f'''\
@triton.jit
def {KERNEL}(
{header}):
    bh = tl.program_id(0)
    pid_m = {pid_m}
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    hk = (h // GROUP).to(tl.int64)  # the key/value head this query head shares
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HEAD_D)
    d_mask = rd < D
    q_mask = (rm[:, None] < SQ) & d_mask[None, :]
    q = tl.load(q_ptr + b * sq_b + h.to(tl.int64) * sq_h + rm[:, None] * sq_s
                + rd[None, :] * sq_d, mask=q_mask, other=0)
    k_base = k_ptr + b * sk_b + hk * sk_h + rd[:, None] * sk_d
    v_base = v_ptr + b * sv_b + hk * sv_h + rd[None, :] * sv_d
    qk_scale = scale * 1.4426950408889634  # log2(e): e**x = 2**(x log2 e)
    m_i = tl.full([BLOCK_M], -_TF_INF, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_D], 0.0, tl.float32)
    kv_len = {length}
    end = {end}
    unmasked = ({full} // BLOCK_N) * BLOCK_N  # blocks of keys every row sees: no mask
{_key_loop(spec, "pid_m * 0", "unmasked", False)}\
{_key_loop(spec, "unmasked", "end", True)}\
    out = tl.where(l_i[:, None] > 0.0, acc / l_i[:, None], 0.0)  # no key seen: zeros
    tl.store(o_ptr + b * so_b + h.to(tl.int64) * so_h + rm[:, None] * so_s + rd[None, :] * so_d,
             out.to(o_ptr.dtype.element_ty), mask=q_mask)
'''
    helpers = [HELPERS[name] for name in ("_tf_add", "_tf_max")]
    return "\n".join(['"""Triton attention generated by tilefold (codegen/triton/attention.py)."""',
                      "import triton",
                      "import triton.language as tl",
                      "",
                      '_TF_INF = tl.constexpr(float("inf"))',
                      "",
                      *(h + "\n" for h in helpers),
                      f"# {spec}",
                      body])


def signature(spec: AttentionSpec, pointer: str) -> dict[str, str]:
    """Triton's type of every run-time parameter (operands and output of type `pointer`)."""
    types = {"len_ptr": "*i32", "scale": "fp32"}
    return {p: types.get(p, pointer if p.endswith("_ptr") else "i32") for p in PARAMS}


def head_tile(d: int) -> int:
    """The head-dim tile for head dim `d`: a power of two of at least 16."""
    return max(16, 1 << max(0, (d - 1).bit_length()))


class TritonAttention:
    """The template for q, k, v of `dtype`; call it with q [B, Hq, Sq, D], k and v
    [B, Hkv, Sk, D] (any strides) and, when `padded`, each batch's key length (int32 [B])."""

    def __init__(self, dtype: str, *, causal: bool = False, padded: bool = False):
        self.dtype = dtype
        interp = interpreting()
        dot = "f32" if interp and dtype == "bf16" else dtype  # the interpreter's bf16 is wrong
        self.spec = AttentionSpec(dot, causal, padded, pipelined=not interp)
        self.source = emit_attention(self.spec)
        self.fn = load_jit(self.source, KERNEL)
        self._no_lengths: dict[Any, Any] = {}  # the unread kv_lens of an unpadded call

    def __call__(self, q: Any, k: Any, v: Any, *, kv_lens: Any = None, scale: float | None = None,
                 block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                 num_stages: int = 2) -> Any:
        import torch

        op = f"Triton attention ({self.dtype})"
        if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
            raise ShapeError(f"{op}: q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D], got q "
                             f"{list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
        bsz, hq, sq, d = q.shape
        if k.shape[0] != bsz or k.shape[3] != d or hq % k.shape[1]:
            raise ShapeError(f"{op}: k {list(k.shape)} must match q {list(q.shape)} in batch "
                             "and head dim, with its heads dividing q's (grouped queries)")
        want = getattr(torch, DTYPES[self.dtype])
        if any(t.dtype != want for t in (q, k, v)):
            raise UnsupportedError(f"{op}: q, k, v must all be {want}")
        if self.spec.padded != (kv_lens is not None):
            raise UnsupportedError(f"{op}: kv_lens must be given exactly when the template "
                                   "was made with padded=True")
        if kv_lens is not None and (kv_lens.shape != (bsz,) or kv_lens.dtype != torch.int32):
            raise ShapeError(f"{op}: kv_lens must be int32 [{bsz}], got {kv_lens.dtype} "
                             f"{list(kv_lens.shape)}")
        wide = interpreting() and self.dtype == "bf16"
        out = torch.empty(q.shape, dtype=torch.float32 if wide else want, device=q.device)
        if wide:
            q, k, v = (widened_f32(t)[0] for t in (q, k, v))
        sk = k.shape[2]
        if kv_lens is None:  # never read: one int32 a device, not an allocation a call
            kv_lens = self._no_lengths.get(q.device)
            if kv_lens is None:
                kv_lens = self._no_lengths[q.device] = torch.zeros(1, dtype=torch.int32,
                                                                   device=q.device)
        scale = 1.0 / float(np.sqrt(d)) if scale is None else float(scale)
        blocks = -(-sq // block_m)
        if blocks > MAX_GRID_Y:
            raise ShapeError(f"{op}: {sq} queries make {blocks} blocks of {block_m}, past the "
                             f"{MAX_GRID_Y} programs a grid's axis 1 holds; use a larger "
                             "block_m")
        if bsz and hq and sq and d:
            with np.errstate(all="ignore"):  # the interpreter's NumPy, on masked lanes
                self.fn[(bsz * hq, blocks)](
                    q, k, v, out, kv_lens, sq, sk, d, hq, hq // k.shape[1], scale,
                    *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                    BLOCK_M=block_m, BLOCK_N=block_n, HEAD_D=head_tile(d),
                    num_warps=num_warps, num_stages=num_stages)
        return out.to(torch.bfloat16) if wide else out


__all__ = ["AttentionSpec", "TritonAttention", "emit_attention", "head_tile", "signature"]
