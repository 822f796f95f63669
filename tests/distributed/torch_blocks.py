"""A GPT-2-style and a LLaMA-style (grouped-query) transformer block as torch nn.Modules, an
MLP (of an even and of an odd hidden width), and MiniLM's fine-tuning step (`bench train`'s
classifier: a small config, and MiniLM's own), for the `parallelize` tests: the one-process
models the parallel runs must match."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

D, HEADS, KV_HEADS, BATCH, SEQ = 64, 4, 2, 4, 8


class MLP(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, hidden), nn.Linear(hidden, 16)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    """Causal self-attention with `kv_heads` key/value heads serving `heads` query heads."""

    def __init__(self, d: int, heads: int, kv_heads: int, bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=bias)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=bias)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=bias)
        self.o = nn.Linear(d, d, bias=bias)

    def forward(self, x):
        b, s, d = x.shape

        def heads(t, n):
            return t.view(b, s, n, self.hd).transpose(1, 2)

        q = heads(self.q(x), self.heads)
        k, v = heads(self.k(x), self.kv_heads), heads(self.v(x), self.kv_heads)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.o(a.transpose(1, 2).reshape(b, s, d))


class GPT2Block(nn.Module):
    def __init__(self, d: int = D, heads: int = HEADS) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, heads, bias=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LlamaBlock(nn.Module):
    def __init__(self, d: int = D, heads: int = HEADS, kv_heads: int = KV_HEADS,
                 hidden: int = 128) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.attn = Attention(d, heads, kv_heads, bias=False)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


MODELS = {"mlp": (MLP, (8, 16)), "mlp31": (partial(MLP, 31), (8, 16)),  # 31: odd on tp=2
          "gpt2": (GPT2Block, (BATCH, SEQ, D)),
          "llama": (LlamaBlock, (BATCH, SEQ, D))}


# MiniLM's classifier (`tilefold bench train`'s step: the loss of ids, mask and labels): a
# small BERT config (cheap), and MiniLM's own (6 layers, 384 wide, its vocabulary); (batch, seq)
MINILM = {"minilm": ({"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "intermediate_size": 64,
                      "max_position_embeddings": 32}, (4, 8)),
          "minilm-full": ({}, (2, 16))}


def minilm_and_inputs(name: str, seed: int = 5) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MiniLM's classifier (random weights) and its (ids, mask, labels): the rows padded to
    different lengths, so the attention mask and the masked mean matter."""
    from tilefold.cli.bench_train import minilm_classifier, minilm_config

    torch.manual_seed(seed)
    overrides, (batch, seq) = MINILM[name]
    config = minilm_config(**overrides)
    model = minilm_classifier(config)
    with torch.no_grad():  # norms' weights and biases random too, not ones and zeros
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    for row in range(1, batch, 2):
        mask[row, seq // 2 + row % 3:] = 0
    return model, (ids, mask, torch.randint(0, 2, (batch,)))


def model_and_input(name: str, seed: int = 5, batch: int | None = None
                    ) -> tuple[nn.Module, torch.Tensor | tuple[torch.Tensor, ...]]:
    """The same random weights and input in every process that asks (`batch` rows instead of
    the model's default); MiniLM's take a tuple of inputs."""
    if name in MINILM:
        return minilm_and_inputs(name, seed)
    torch.manual_seed(seed)
    cls, shape = MODELS[name]
    shape = shape if batch is None else (batch, *shape[1:])
    model = cls().eval()
    with torch.no_grad():  # norms' weights and biases random too, not ones and zeros
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model, torch.randn(*shape)
