"""A LLaMA-family causal LM (GGUF architectures llama, qwen2) as tilefold IR, built from a GGUF
file's tensors: no PyTorch.

`llama_step(config, weights)` is one function for the prompt and for every decoded token:

    @main(%ids: i64[1, ?n], %start: i64[], %k0, %v0, ..., %k{L-1}, %v{L-1})
        -> (%logits: f32[1, vocab], %k0', %v0', ...)

`ids` are `n` tokens at positions start .. start + n - 1; each layer's K and V cache
(f32[1, kv_heads, max_length, head_dim]) gets their rows written (`index_put`, donated: in
place) and attends to every cached position up to its own; the logits are the last token's.
One compile serves the prompt (n = its length) and each decoded token (n = 1): plans are
made per n. The graph is the one Hugging Face's `LlamaForCausalLM` hands the torch frontend
(rotate-half RoPE, grouped-query attention, SwiGLU; `Qwen2ForCausalLM`'s adds biases to Q, K
and V: a projection whose `.bias` the file holds adds it), with the weights as constants:

- "f32": every weight dequantized to f32 (the gguf package's decoder, as transformers loads
  it: the same numbers as the Hugging Face model);
- "int8" / "int4": matmul weights stored as codes and scales as `quantize-weights` stores
  them (`passes/quantize_weights.quantize_weight`, the vocabulary head at int8), quantized a
  tensor at a time so no f32 copy of the whole model is ever held. A vocabulary head tied to
  the token embedding serves the embedding too: its rows of codes are gathered and
  dequantized, and no f32 table is kept.

For llama, the GGUF converter permutes the rows of Q and K (weights and biases) for llama.cpp's
interleaved RoPE; they are permuted back here (exactly: a row order). For qwen2 it does not
(llama.cpp runs qwen2 with rotate-half RoPE): its rows are Hugging Face's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from tilefold import dtypes
from tilefold.errors import UnsupportedError
from tilefold.frontend.llama_config import LlamaConfig
from tilefold.ir import Module
from tilefold.ir.builder import Builder, Tensor
from tilefold.ir.ops.shape import BEGIN, END
from tilefold.ir.types import SymDim
from tilefold.passes.quantize_weights import FORMATS, HEAD_RATIO, quantize_weight
from tilefold.runtime.buffers import release_pages

WEIGHT_FORMATS = ("f32", *FORMATS)
HEAD_FORMAT = "int8"  # the vocabulary head's codes at int4, as `quantize-weights` stores it


# Codes and scales of a weight (by name; `weight()` gives it in f32) at a format, as
# `quantize_weight(weight(), 1, fmt)` computes them (or a cache of them: `weight_cache.py`).
Quantize = Callable[[str, Callable[[], np.ndarray], str], tuple[np.ndarray, np.ndarray]]
# A model's weights by GGUF name (`name in weights`; `weights[name]`: f32, [rows, columns] as a
# torch Linear's [N, K], or a vector), read when asked for.
Weights = Mapping[str, np.ndarray]


def unpermute_rows(heads: int, rows: int) -> np.ndarray:
    """The row order that undoes the GGUF converter's Q/K permutation: row (h, i, j) of a
    head's [2, head_dim / 2] halves is the file's row (h, j, i)."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(0, 2, 1).reshape(-1)


class _Step:
    """Builds the step function; `fmt` is how matmul weights are stored."""

    def __init__(self, config: LlamaConfig, weights: Weights, fmt: str, max_length: int,
                 every_position: bool, quantize: Quantize | None):
        if fmt not in WEIGHT_FORMATS:
            raise UnsupportedError(f"weights={fmt!r}: use one of {', '.join(WEIGHT_FORMATS)}")
        self.c, self.weights, self.fmt, self.max_length = config, weights, fmt, max_length
        self.every_position = every_position
        self.quantize = quantize or (lambda name, weight, fmt: quantize_weight(weight(), 1, fmt))
        self.coded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.stacked: dict[str, np.ndarray] = {}  # f32 weights read into one buffer (together)
        self.b = Builder("main")

    def together(self, *weights: tuple[str, np.ndarray | None]) -> None:
        """Read f32 matmul weights of one input (name, row order) into one buffer, one after
        another, so that merge-matmuls views them as its merged weight instead of copying."""
        if self.fmt != "f32":
            return
        parts = [self.weights[name] if rows is None else self.weights[name][rows]
                 for name, rows in weights]
        buffer = np.concatenate(parts, dtype=np.float32)
        release_pages(*parts)  # parts read from a mapped F32 file leave the process
        at = 0
        for (name, _), part in zip(weights, parts, strict=True):
            self.stacked[name] = buffer[at:at + len(part)]
            at += len(part)

    def linear(self, x: Tensor, name: str, rows: np.ndarray | None = None) -> Tensor:
        """x @ W^T (+ bias) for the GGUF weight `name` (its rows, and its bias's, reordered by
        `rows`); the bias is the file's `.bias` beside it, where it has one."""
        y = self.b.op("matmul", x, self.matrix(name, x.shape[-1], self.fmt, rows),
                      transpose_b=True)
        bias = name.removesuffix(".weight") + ".bias"
        if bias not in self.weights:
            return y
        vector = np.asarray(self.weights[bias], np.float32)
        return y + self.b.constant(np.ascontiguousarray(vector if rows is None else vector[rows]))

    def matrix(self, name: str, k: int, fmt: str, rows: np.ndarray | None = None) -> Tensor:
        """The [N, k] weight `name` as an f32 constant, or dequantized from codes and scales
        at `fmt` (kept in `self.coded`)."""
        read = []

        def weight() -> np.ndarray:
            read.append(self.weights[name])
            return read[-1] if rows is None else read[-1][rows]

        if fmt == "f32" or k % (FORMATS[fmt][3] or 1):
            array = self.stacked.pop(name, None)
            if array is None:
                array = np.ascontiguousarray(weight(), np.float32)
            return self.b.constant(array, copy=False)
        codes, scale = self.coded[name] = self.quantize(name, weight, fmt)
        release_pages(*read)  # an F32 file's weight, once quantized, leaves the process
        b = self.b
        return b.op("dequantize", b.constant(codes, copy=False), b.constant(scale, copy=False),
                    dtype=dtypes.f32)

    def norm(self, x: Tensor, name: str) -> Tensor:
        weight = self.b.constant(np.ascontiguousarray(self.weights[name], np.float32))
        return self.b.op("rms_norm", x, weight, eps=self.c.eps)

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x * cos + rotate_half(x) * sin on [1, heads, n, head_dim], with rotate_half(x) =
        concat(-hi, lo) written as the halves swapped (a reversed view of x as [.., 2, half])
        times `sin` whose first half is negated (`angles`): one kernel, no concatenation, and
        the same rounding ((-hi) * s == hi * (-s) exactly)."""
        half, (_, heads, n, _) = self.c.head_dim // 2, x.shape
        pairs = x.reshape(1, heads, n, 2, half)
        swapped = self.b.op("slice", pairs, starts=(0, 0, 0, -1, 0),
                            stops=(END, END, END, BEGIN, END), steps=(1, 1, 1, -1, 1))
        return (pairs * cos + swapped * sin).reshape(1, heads, n, self.c.head_dim)

    def heads(self, x: Tensor, count: int, n: SymDim) -> Tensor:
        """[1, n, count * head_dim] -> [1, count, n, head_dim]."""
        split = x.reshape(1, n, count, self.c.head_dim)
        return self.b.op("transpose", split, perm=(0, 2, 1, 3))

    def build(self) -> Module:
        c, b = self.c, self.b
        n = SymDim("n")
        cache = c.cache_shape(self.max_length)
        ids = b.arg("ids", "i64", (1, n))
        start = b.arg("start", "i64", ())
        caches = [b.arg(f"{kind}{i}", "f32", cache) for i in range(c.layers) for kind in "kv"]

        positions = b.op("arange", shape=(n,)) + start  # i64[n]
        inv_freq = 1.0 / c.rope_theta ** (np.arange(0, c.head_dim, 2) / c.head_dim)
        freqs = (b.op("expand_dims", positions.astype("f32"), axes=(1,))
                 * b.constant(inv_freq.astype(np.float32)))  # [n, head_dim / 2]
        angles = b.op("expand_dims", freqs, axes=(1,)).reshape(1, 1, n, 1, c.head_dim // 2)
        sign = b.constant(np.array([[-1.0], [1.0]], np.float32))  # rotate_half's -hi, lo
        cos = b.op("cos", angles)  # [1, 1, n, 1, head_dim / 2]
        sin = b.op("sin", angles) * sign  # [1, 1, n, 2, head_dim / 2]
        keys = b.op("arange", shape=(self.max_length,))
        mask = b.op("le", keys.reshape(1, 1, 1, self.max_length),
                    positions.reshape(1, 1, n, 1))  # bool[1, 1, n, max_length]

        head = "output.weight" if "output.weight" in self.weights else "token_embd.weight"
        head_fmt = HEAD_FORMAT if self.fmt != "f32" and c.vocab >= HEAD_RATIO * c.hidden \
            else self.fmt
        head_weight = self.matrix(head, c.hidden, head_fmt)
        table = self.coded.get("token_embd.weight")
        if table is None:  # the f32 table: the tied head's own array where it is f32 too
            tied = head == "token_embd.weight" and head_fmt == "f32"
            table = head_weight if tied else self.matrix("token_embd.weight", c.hidden, "f32")
        if isinstance(table, tuple):  # rows of the tied head's codes: no f32 table kept
            codes, scale = (b.op("gather", b.constant(a, copy=False), ids) for a in table)
            groups = table[1].shape[1]  # scales per row: [1, n, groups, K / groups] blocks
            x = (codes.astype("f32").reshape(1, n, groups, c.hidden // groups)
                 * scale.reshape(1, n, groups, 1)).reshape(1, n, c.hidden)  # as `dequantize`
        else:
            x = b.op("gather", table, ids)
        q_rows = unpermute_rows(c.heads, c.heads * c.head_dim) if c.qk_permuted else None
        k_rows = unpermute_rows(c.kv_heads, c.kv_heads * c.head_dim) if c.qk_permuted else None
        written = []
        for i in range(c.layers):
            blk = f"blk.{i}."
            h = self.norm(x, blk + "attn_norm.weight")
            self.together((blk + "attn_q.weight", q_rows), (blk + "attn_k.weight", k_rows),
                          (blk + "attn_v.weight", None))
            q = self.rope(self.heads(self.linear(h, blk + "attn_q.weight", q_rows), c.heads, n),
                          cos, sin)
            k = self.rope(self.heads(self.linear(h, blk + "attn_k.weight", k_rows), c.kv_heads,
                                     n), cos, sin)
            v = self.heads(self.linear(h, blk + "attn_v.weight"), c.kv_heads, n)
            k_cache = b.op("index_put", caches[2 * i], k, positions, axes=(2,))
            v_cache = b.op("index_put", caches[2 * i + 1], v, positions, axes=(2,))
            written += [k_cache, v_cache]
            o = b.op("scaled_dot_product_attention", q, k_cache, v_cache, mask,
                     scale=1.0 / math.sqrt(c.head_dim), enable_gqa=c.kv_heads != c.heads)
            o = b.op("transpose", o, perm=(0, 2, 1, 3)).reshape(1, n, c.hidden)
            x = x + self.linear(o, blk + "attn_output.weight")
            h = self.norm(x, blk + "ffn_norm.weight")
            self.together((blk + "ffn_gate.weight", None), (blk + "ffn_up.weight", None))
            gate = self.linear(h, blk + "ffn_gate.weight")
            up = self.linear(h, blk + "ffn_up.weight")
            x = x + self.linear(gate * b.op("sigmoid", gate) * up, blk + "ffn_down.weight")
        x = self.norm(x, "output_norm.weight")
        if not self.every_position:
            last = (b.op("dim_size", ids, axis=1) - 1).reshape(1)
            x = b.op("gather", x, last, axis=1)  # [1, 1, hidden]: the last token's
        logits = b.op("matmul", x, head_weight, transpose_b=True)
        return b.build(logits.reshape(-1, c.vocab), *written)


def llama_step(config: LlamaConfig, weights: Weights, *, weights_format: str = "f32",
               max_length: int, every_position: bool = False,
               quantize: Quantize | None = None) -> Module:
    """The step function of the module docstring; `every_position` returns every token's
    logits (f32[n, vocab], for perplexity) instead of the last one's; `quantize` makes codes
    and scales (default: `quantize_weight`)."""
    return _Step(config, weights, weights_format, max_length, every_position,
                 quantize).build()


def donated(config: LlamaConfig) -> dict[int, int]:
    """`tilefold.compile`'s `donate`: result 1 + j (a written cache) to argument 2 + j."""
    return {1 + j: 2 + j for j in range(2 * config.layers)}
