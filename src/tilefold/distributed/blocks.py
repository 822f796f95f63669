"""Transformer block programs (GPT-2 and LLaMA shaped, any size and depth) for planning tests
and the shard CLI: activations token-major `[batch*seq, D]`, every value and parameter of
layer i named `%l{i}_...` so that a search can tell repeated layers apart."""

from __future__ import annotations

from dataclasses import dataclass

from tilefold.errors import TilefoldError
from tilefold.ir import Module, parse_module

LAYER_PREFIX = r"l(\d+)_"  # the names of layer i's values start with l{i}_


@dataclass(frozen=True)
class BlockShape:
    """A transformer's sizes: model width, heads (and key/value heads for GQA), FFN width."""

    d: int = 64
    heads: int = 4
    kv_heads: int | None = None
    ffn: int | None = None
    batch: int = 2
    seq: int = 8
    layers: int = 1
    dtype: str = "f32"

    def __post_init__(self) -> None:
        if self.d % self.heads or self.heads % (self.kv_heads or self.heads):
            raise TilefoldError(f"block shape: D {self.d} must split into {self.heads} heads, "
                                f"and the heads into {self.kv_heads} key/value groups")

    @property
    def head_dim(self) -> int:
        return self.d // self.heads


class Text:
    """IR lines of one function under construction."""

    def __init__(self, s: BlockShape):
        self.s = s
        self.args: list[str] = []
        self.lines: list[str] = []

    def t(self, *shape: int) -> str:
        return f"{self.s.dtype}[{','.join(map(str, shape))}]"

    def arg(self, name: str, *shape: int) -> str:
        self.args.append(f"%{name}: {self.t(*shape)}")
        return name

    def op(self, name: str, text: str, *shape: int) -> str:
        self.lines.append(f"  %{name} = {text} : {self.t(*shape)}")
        return name

    def linear(self, p: str, x: str, d_in: int, d_out: int, bias: bool) -> str:
        tokens = self.s.batch * self.s.seq
        w = self.arg(f"{p}_w", d_in, d_out)
        y = self.op(f"{p}", f"matmul(%{x}, %{w})", tokens, d_out)
        if bias:
            b = self.arg(f"{p}_b", d_out)
            y = self.op(f"{p}_bias", f"add(%{y}, %{b})", tokens, d_out)
        return y

    def heads(self, p: str, x: str, n: int) -> str:
        """[T, n*hd] -> [b, n, s, hd]"""
        s, hd = self.s, self.s.head_dim
        r = self.op(f"{p}_4d", f"reshape(%{x}) {{shape = [{s.batch},{s.seq},{n},{hd}]}}",
                    s.batch, s.seq, n, hd)
        return self.op(f"{p}_t", f"transpose(%{r}) {{perm = [0,2,1,3]}}", s.batch, n, s.seq, hd)

    def attention(self, p: str, x: str, bias: bool, fused: bool) -> str:
        s, hd = self.s, self.s.head_dim
        kv = s.kv_heads or s.heads
        if fused:  # one [D, H*3*hd] weight, q/k/v interleaved per head (Megatron's layout)
            qkv = self.linear(f"{p}_qkv", x, s.d, 3 * s.d, bias)
            r = self.op(f"{p}_qkv4", f"reshape(%{qkv}) {{shape = "
                        f"[{s.batch},{s.seq},{s.heads},{3 * hd}]}}",
                        s.batch, s.seq, s.heads, 3 * hd)
            parts = []
            for i, name in enumerate("qkv"):
                sl = self.op(f"{p}_{name}s", f"slice(%{r}) {{starts = [0,0,0,{i * hd}], stops = "
                             f"[{s.batch},{s.seq},{s.heads},{(i + 1) * hd}], steps = "
                             "[1,1,1,1]}", s.batch, s.seq, s.heads, hd)
                parts.append(self.op(f"{p}_{name}t", f"transpose(%{sl}) {{perm = [0,2,1,3]}}",
                                     s.batch, s.heads, s.seq, hd))
            q, k, v = parts
        else:
            q = self.heads(f"{p}_q", self.linear(f"{p}_q", x, s.d, s.d, bias), s.heads)
            k = self.heads(f"{p}_k", self.linear(f"{p}_k", x, s.d, kv * hd, bias), kv)
            v = self.heads(f"{p}_v", self.linear(f"{p}_v", x, s.d, kv * hd, bias), kv)
        gqa = ", enable_gqa = true" if kv != s.heads else ""
        a = self.op(f"{p}_sdpa", f"scaled_dot_product_attention(%{q}, %{k}, %{v}) "
                    f"{{is_causal = true{gqa}}}", s.batch, s.heads, s.seq, hd)
        a = self.op(f"{p}_at", f"transpose(%{a}) {{perm = [0,2,1,3]}}",
                    s.batch, s.seq, s.heads, hd)
        a = self.op(f"{p}_a2", f"reshape(%{a}) {{shape = [{s.batch * s.seq},{s.d}]}}",
                    s.batch * s.seq, s.d)
        return self.linear(f"{p}_o", a, s.d, s.d, bias)

    def module(self, out: str) -> Module:
        tokens = self.s.batch * self.s.seq
        head = f"func @main({', '.join(self.args)}) -> ({self.t(tokens, self.s.d)}) {{"
        return parse_module("\n".join([head, *self.lines, f"  return(%{out})", "}"]))


def gpt2(s: BlockShape, fused_qkv: bool = False) -> Module:
    """Pre-norm GPT-2 layers: layer_norm, causal attention, residual, layer_norm, GELU MLP."""
    f = Text(s)
    tokens, ffn = s.batch * s.seq, s.ffn or 4 * s.d
    x = f.arg("x", tokens, s.d)
    for i in range(s.layers):
        p = f"l{i}"
        w1, b1 = f.arg(f"{p}_ln1_w", s.d), f.arg(f"{p}_ln1_b", s.d)
        n1 = f.op(f"{p}_n1", f"layer_norm(%{x}, %{w1}, %{b1})", tokens, s.d)
        r1 = f.op(f"{p}_r1", f"add(%{x}, %{f.attention(p, n1, True, fused_qkv)})", tokens, s.d)
        w2, b2 = f.arg(f"{p}_ln2_w", s.d), f.arg(f"{p}_ln2_b", s.d)
        n2 = f.op(f"{p}_n2", f"layer_norm(%{r1}, %{w2}, %{b2})", tokens, s.d)
        h = f.op(f"{p}_gelu", f"gelu(%{f.linear(f'{p}_fc1', n2, s.d, ffn, True)})", tokens, ffn)
        x = f.op(f"{p}_out", f"add(%{r1}, %{f.linear(f'{p}_fc2', h, ffn, s.d, True)})",
                 tokens, s.d)
    return f.module(x)


def llama(s: BlockShape) -> Module:
    """LLaMA layers: rms_norm, causal attention with grouped key/value heads, residual,
    rms_norm, SwiGLU MLP; no biases (rotary embeddings left out: they do not move data)."""
    f = Text(s)
    tokens, ffn = s.batch * s.seq, s.ffn or 4 * s.d
    x = f.arg("x", tokens, s.d)
    for i in range(s.layers):
        p = f"l{i}"
        n1 = f.op(f"{p}_n1", f"rms_norm(%{x}, %{f.arg(f'{p}_norm1', s.d)})", tokens, s.d)
        r1 = f.op(f"{p}_r1", f"add(%{x}, %{f.attention(p, n1, False, False)})", tokens, s.d)
        n2 = f.op(f"{p}_n2", f"rms_norm(%{r1}, %{f.arg(f'{p}_norm2', s.d)})", tokens, s.d)
        gate = f.op(f"{p}_silu", f"silu(%{f.linear(f'{p}_gate', n2, s.d, ffn, False)})",
                    tokens, ffn)
        up = f.linear(f"{p}_up", n2, s.d, ffn, False)
        h = f.op(f"{p}_swiglu", f"mul(%{gate}, %{up})", tokens, ffn)
        x = f.op(f"{p}_out", f"add(%{r1}, %{f.linear(f'{p}_down', h, ffn, s.d, False)})",
                 tokens, s.d)
    return f.module(x)


BLOCKS = {"gpt2": gpt2, "llama": llama}
