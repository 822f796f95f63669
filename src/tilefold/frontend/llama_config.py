"""The shape of a LLaMA-family model, read from a GGUF file's metadata: light to import (no IR,
no compiler), so that a process running a saved step (`gguf_generator.py`) needs no more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilefold.errors import UnsupportedError

# GGUF architecture built natively -> whether its converter permuted the rows of Q and K
QK_PERMUTED = {"llama": True, "qwen2": False}
ARCHITECTURES = tuple(QK_PERMUTED)


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a LLaMA-family model (GGUF's `{architecture}.*` keys)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    eps: float
    rope_theta: float
    context: int  # the positions it was trained for
    qk_permuted: bool  # Q/K rows in llama.cpp's interleaved order (QK_PERMUTED)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_gguf(cls, architecture: str, metadata: dict[str, Any], vocab: int
                  ) -> LlamaConfig:
        if architecture not in ARCHITECTURES:
            raise UnsupportedError(f"GGUF architecture {architecture!r}: tilefold builds "
                                   f"{', '.join(ARCHITECTURES)} natively")

        def key(name: str, default: Any = None) -> Any:
            value = metadata.get(f"{architecture}.{name}", default)
            if value is None:
                raise UnsupportedError(f"GGUF file has no {architecture}.{name}")
            return value

        heads = int(key("attention.head_count"))
        hidden = int(key("embedding_length"))
        if int(key("rope.dimension_count", hidden // heads)) != hidden // heads:
            raise UnsupportedError("partial rotary embeddings (rope.dimension_count below the "
                                   "head size) are not built natively")
        return cls(layers=int(key("block_count")), hidden=hidden, heads=heads,
                   kv_heads=int(key("attention.head_count_kv", heads)),
                   ffn=int(key("feed_forward_length")), vocab=vocab,
                   eps=float(key("attention.layer_norm_rms_epsilon")),
                   rope_theta=float(key("rope.freq_base", 10000.0)),
                   context=int(key("context_length")),
                   qk_permuted=QK_PERMUTED[architecture])

    def cache_shape(self, max_length: int) -> tuple[int, int, int, int]:
        return (1, self.kv_heads, max_length, self.head_dim)
