"""The arithmetic of `tilefold generate`'s figures: bytes a decoded token reads (weights at their
stored precision, the KV cache at its length), perplexity and the KL divergence of next-token
distributions, all from plain arrays and shapes (no model, no torch).

A decode step reads every weight once, except an embedding table, of which it gathers one row; a
tied embedding is read twice over, as the output projection (whole) and as the gather (a row).
tilefold's int8 / int4 weights are the quantize-weights pass's codes and f32 scales (int8: one
scale an output channel; int4: one every 32 along K), and only the matmul weights the pass takes
are quantized: the rest stays f32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tilefold.passes.quantize_weights import FORMATS, QuantizeWeights

F32 = 4  # bytes
SCALE_BYTES = 4  # the pass's scales are f32
_MIN_ELEMENTS = next(o.default for o in QuantizeWeights.options if o.name == "min-elements")
ROWS_A_CHUNK = 64  # log-softmax in float64 this many positions at a time


@dataclass(frozen=True)
class Weight:
    """A parameter as a decode step uses it: `use` is "matmul" (an [N, K] weight read whole),
    "gather" (a [rows, width] table of which one row is read) or "other" (read whole, f32)."""

    name: str
    shape: tuple[int, ...]
    use: str
    tensor: str = ""  # the stored tensor (tied weights share one); `name` when empty

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def quantized(weight: Weight, fmt: str) -> bool:
    """Whether the quantize-weights pass stores `weight` as `fmt` codes (else f32)."""
    if fmt == "f32" or weight.use != "matmul" or len(weight.shape) != 2:
        return False
    group = FORMATS[fmt][2]
    return weight.size >= _MIN_ELEMENTS and weight.shape[1] % (group or 2) == 0


def matmul_bytes(weight: Weight, fmt: str) -> int:
    """Bytes of an [N, K] matmul weight stored as `fmt` by tilefold (codes and scales)."""
    if not quantized(weight, fmt):
        return weight.size * F32
    code, _, group = FORMATS[fmt]
    n, k = weight.shape
    scales = n if group is None else n * (k // group)
    return weight.size * code.bits // 8 + scales * SCALE_BYTES


def weight_bytes_per_token(weights: Iterable[Weight], fmt: str) -> int:
    """Bytes of weights one decoded token reads when tilefold stores them as `fmt`
    ("f32", "int8" or "int4"): matmul weights at that precision, one row of a gathered table,
    everything else whole in f32."""
    if fmt not in ("f32", *FORMATS):
        raise ValueError(f"weight format {fmt!r}")
    total = 0
    for w in weights:
        if w.use == "matmul":
            total += matmul_bytes(w, fmt)
        elif w.use == "gather":
            total += w.size // w.shape[0] * F32
        else:
            total += w.size * F32
    return total


def weight_bytes_stored(weights: Iterable[Weight], fmt: str) -> int:
    """Bytes of the model's weights held once each at `fmt`: a tensor any matmul uses at its
    quantized size when the pass quantizes it, the rest in f32 (the footprint a runtime that
    keeps no f32 copy beside quantized weights needs)."""
    uses: dict[str, list[Weight]] = {}
    for w in weights:
        uses.setdefault(w.tensor or w.name, []).append(w)
    total = 0
    for same in uses.values():
        matmul = [w for w in same if w.use == "matmul"]
        total += matmul_bytes(matmul[0], fmt) if matmul else same[0].size * F32
    return total


def gguf_bytes_per_token(tensors: Iterable[tuple[str, int, int]]) -> int:
    """Bytes of weights one decoded token reads from a GGUF file's (name, bytes, rows)
    tensors: every tensor whole, except the token embedding, of which one row is gathered —
    unless the file has no `output.weight`, when the embedding is the output projection too
    (tied) and is read whole besides."""
    sizes = {name: (nbytes, rows) for name, nbytes, rows in tensors}
    total = sum(nbytes for nbytes, _ in sizes.values())
    if "token_embd.weight" in sizes:
        nbytes, rows = sizes["token_embd.weight"]
        total += nbytes // rows - (nbytes if "output.weight" in sizes else 0)
    return total


def kv_bytes(layers: int, kv_heads: int, head_dim: int, positions: float,
             element_bytes: int) -> float:
    """Bytes of K and V over `positions` positions: what a decoded token reads attending over
    them, or a cache of that length."""
    return 2 * layers * kv_heads * head_dim * positions * element_bytes


def mean_decode_context(prompt: int, new_tokens: int) -> float:
    """The mean number of positions a decoded token attends over: the k-th token after the
    first (k = 1 .. new_tokens - 1) attends over prompt + k."""
    return prompt + new_tokens / 2


def bandwidth_share(tokens_per_s: float, bytes_per_token: float, gbps: float) -> float:
    """The fraction of the read bandwidth (GB/s) that decoding at `tokens_per_s` uses."""
    return tokens_per_s * bytes_per_token / (gbps * 1e9)


# ---- accuracy -------------------------------------------------------------------------------

def _log_softmax(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _scored(logits: np.ndarray, tokens: Sequence[int]) -> int:
    """Positions that predict a next token: all but the last."""
    if logits.ndim != 2 or logits.shape[0] != len(tokens) or len(tokens) < 2:
        raise ValueError(f"logits {logits.shape} for {len(tokens)} tokens: need [T, vocab], "
                         "T >= 2")
    return len(tokens) - 1


def perplexity(logits: np.ndarray, tokens: Sequence[int]) -> float:
    """exp of the mean negative log-likelihood of tokens[1:] under logits[:-1] (one window,
    every position scored), computed in float64."""
    n = _scored(logits, tokens)
    targets = np.asarray(tokens[1:], dtype=np.int64)
    nll = 0.0
    for start in range(0, n, ROWS_A_CHUNK):
        stop = min(start + ROWS_A_CHUNK, n)
        logp = _log_softmax(logits[start:stop])
        nll -= logp[np.arange(stop - start), targets[start:stop]].sum()
    return float(np.exp(nll / n))


@dataclass(frozen=True)
class Agreement:
    """How a model's next-token distributions compare with a reference's, over the scored
    positions: mean and largest KL(reference || model), and how often the top token agrees."""

    kl_mean: float
    kl_max: float
    top1: float


def agreement(reference: np.ndarray, logits: np.ndarray, tokens: Sequence[int]) -> Agreement:
    """KL divergence of `logits`' next-token distributions from `reference`'s (float64) and the
    share of positions where both put the same token on top."""
    n = _scored(logits, tokens)
    if reference.shape != logits.shape:
        raise ValueError(f"reference logits {reference.shape} vs {logits.shape}")
    kl = np.empty(n)
    same = 0
    for start in range(0, n, ROWS_A_CHUNK):
        stop = min(start + ROWS_A_CHUNK, n)
        ref, got = _log_softmax(reference[start:stop]), _log_softmax(logits[start:stop])
        kl[start:stop] = (np.exp(ref) * (ref - got)).sum(axis=-1)
        same += int((ref.argmax(-1) == got.argmax(-1)).sum())
    return Agreement(float(kl.mean()), float(kl.max()), same / n)
