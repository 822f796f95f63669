"""Programs for the per-rank tests: Megatron's MLP, a GPT-2-style block and a LLaMA-style
block as IR text with placements per strategy (dp, tp, dp+tp), their float64 NumPy meaning,
and running a partitioned program's ranks on global inputs."""

from __future__ import annotations

from math import erf, sqrt

import numpy as np

from tilefold.distributed import join, run_ranks, split
from tilefold.ir import Module, parse_module, verify
from tilefold.passes import run_pipeline

D, HEADS = 64, 4
SPMD = "propagate-sharding,expand-redistribute"

# Each weight's placement on a tensor-parallel axis (Megatron: column- then row-parallel);
# on a data-parallel axis every weight is R and the activations' batch dim S(0).
TP = {
    "x": "R", "mask": "R", "g1": "R", "e1": "R", "g2": "R", "e2": "R",
    "wq": "S(1)", "wk": "S(1)", "wv": "S(1)", "bq": "S(0)", "bk": "S(0)", "bv": "S(0)",
    "wo": "S(0)", "bo": "R", "w1": "S(1)", "b1": "S(0)", "w2": "S(0)", "b2": "R",
}
MESHES = {  # name -> (axes, the role of each axis)
    "dp2": ({"dp": 2}, "d"), "dp4": ({"dp": 4}, "d"), "dp8": ({"dp": 8}, "d"),
    "tp2": ({"tp": 2}, "t"), "tp4": ({"tp": 4}, "t"),
    "dp2tp2": ({"dp": 2, "tp": 2}, "dt"), "dp2tp4": ({"dp": 2, "tp": 4}, "dt"),
}


def mesh_line(mesh: str) -> str:
    axes, _ = MESHES[mesh]
    return f"mesh @m [{', '.join(f'{a}={n}' for a, n in axes.items())}]"


def place(name: str, mesh: str) -> str:
    """The placement text of argument `name` on `mesh` (x is the only batch-carrying one)."""
    _, roles = MESHES[mesh]
    each = [("S(0)" if name == "x" else "R") if role == "d" else TP[name] for role in roles]
    return f"@m[{','.join(each)}]"


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))


# -- Megatron's MLP -----------------------------------------------------------------------------

def mlp_text(mesh: str, dt: str = "f64", rows: int = 8) -> str:
    x, w1, b1 = (place(n, mesh) for n in ("x", "w1", "b1"))
    w2, b2 = place("w2", mesh), place("b2", mesh)
    return f"""{mesh_line(mesh)}
func @main(%x: {dt}[{rows},16] {x}, %w1: {dt}[16,32] {w1}, %b1: {dt}[32] {b1},
           %w2: {dt}[32,16] {w2}, %b2: {dt}[16] {b2}) -> ({dt}[{rows},16]) {{
  %h = matmul(%x, %w1) : {dt}[{rows},32]
  %a = add(%h, %b1) : {dt}[{rows},32]
  %g = gelu(%a) : {dt}[{rows},32]
  %o = matmul(%g, %w2) : {dt}[{rows},16]
  %y = add(%o, %b2) : {dt}[{rows},16]
  return(%y)
}}"""


def mlp_inputs(rng: np.random.Generator, dt=np.float64, rows: int = 8) -> list[np.ndarray]:
    shapes = ((rows, 16), (16, 32), (32,), (32, 16), (16,))
    return [rng.standard_normal(s).astype(dt) for s in shapes]


def numpy_mlp(x, w1, b1, w2, b2):
    x, w1, b1, w2, b2 = (np.asarray(a, np.float64) for a in (x, w1, b1, w2, b2))
    return gelu(x @ w1 + b1) @ w2 + b2


# -- a GPT-2-style block ------------------------------------------------------------------------

ARGS = ("x", "mask", "g1", "e1", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
        "g2", "e2", "w1", "b1", "w2", "b2")


def block_text(mesh: str, batch: int = 8, seq: int = 4, dt: str = "f64",
               sdpa: bool = False) -> str:
    """Pre-norm block: x + attn(ln1(x)), then + mlp(ln2(.)); causal attention as matmul,
    softmax and matmul over a mask argument, or one scaled_dot_product_attention."""
    b, s, e = batch, seq, D // HEADS
    shapes = {"x": [b, s, D], "mask": [s, s], "w1": [D, 4 * D], "b1": [4 * D],
              "w2": [4 * D, D], **{w: [D, D] for w in ("wq", "wk", "wv", "wo")}}
    args = [n for n in ARGS if not (sdpa and n == "mask")]
    sig = ",\n    ".join(f"%{n}: {dt}[{','.join(map(str, shapes.get(n, [D])))}] "
                           f"{place(n, mesh)}" for n in args)
    act, heads, scores = f"{dt}[{b},{s},{D}]", f"{dt}[{b},{HEADS},{s},{e}]", \
        f"{dt}[{b},{HEADS},{s},{s}]"
    lines = [f"%h1 = layer_norm(%x, %g1, %e1) : {act}"]
    for n in "qkv":
        lines += [f"%{n}0 = matmul(%h1, %w{n}) : {act}", f"%{n}1 = add(%{n}0, %b{n}) : {act}",
                  f"%{n}2 = reshape(%{n}1) {{shape = [{b}, {s}, {HEADS}, {e}]}} : "
                  f"{dt}[{b},{s},{HEADS},{e}]",
                  f"%{n} = transpose(%{n}2) {{perm = [0, 2, 1, 3]}} : {heads}"]
    if sdpa:
        lines += [f"%a0 = scaled_dot_product_attention(%q, %k, %v) {{is_causal = true}} : "
                  f"{heads}"]
    else:
        lines += [f"%s0 = matmul(%q, %k) {{transpose_b = true}} : {scores}",
                  f"%c = constant() {{value = dense<{dt}[] [0.25]>}} : {dt}[]",
                  f"%s1 = mul(%s0, %c) : {scores}", f"%s2 = add(%s1, %mask) : {scores}",
                  f"%p = softmax(%s2) {{axis = -1}} : {scores}",
                  f"%a0 = matmul(%p, %v) : {heads}"]
    lines += [f"%a1 = transpose(%a0) {{perm = [0, 2, 1, 3]}} : {dt}[{b},{s},{HEADS},{e}]",
              f"%a2 = reshape(%a1) {{shape = [{b}, {s}, {D}]}} : {act}",
              f"%o0 = matmul(%a2, %wo) : {act}", f"%o1 = add(%o0, %bo) : {act}",
              f"%r1 = add(%x, %o1) : {act}", f"%h2 = layer_norm(%r1, %g2, %e2) : {act}",
              f"%f0 = matmul(%h2, %w1) : {dt}[{b},{s},{4 * D}]",
              f"%f1 = add(%f0, %b1) : {dt}[{b},{s},{4 * D}]",
              f"%f2 = gelu(%f1) : {dt}[{b},{s},{4 * D}]", f"%f3 = matmul(%f2, %w2) : {act}",
              f"%f4 = add(%f3, %b2) : {act}", f"%y = add(%r1, %f4) : {act}", "return(%y)"]
    body = "\n  ".join(lines)
    return f"{mesh_line(mesh)}\nfunc @main(\n    {sig}) -> ({act}) {{\n  {body}\n}}"


def block_inputs(rng: np.random.Generator, batch: int = 8, seq: int = 4, dt=np.float64,
                 sdpa: bool = False) -> list[np.ndarray]:
    shapes = {"x": (batch, seq, D), "mask": (seq, seq), "w1": (D, 4 * D), "b1": (4 * D,),
              "w2": (4 * D, D), **{w: (D, D) for w in ("wq", "wk", "wv", "wo")}}
    out = []
    for n in ARGS:
        if n == "mask":
            if not sdpa:
                out.append(np.triu(np.full((seq, seq), -1e9), 1).astype(dt))
            continue
        scale = 1.0 if n in ("x", "g1", "g2") else 0.2
        out.append((scale * rng.standard_normal(shapes.get(n, (D,)))).astype(dt))
    return out


def numpy_block(*arrays: np.ndarray, sdpa: bool = False) -> np.ndarray:
    names = [n for n in ARGS if not (sdpa and n == "mask")]
    a = {n: np.asarray(v, np.float64) for n, v in zip(names, arrays, strict=True)}
    b, s, _ = a["x"].shape

    def ln(x, g, e):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + e

    def heads(t):
        return t.reshape(b, s, HEADS, D // HEADS).transpose(0, 2, 1, 3)

    h = ln(a["x"], a["g1"], a["e1"])
    q, k, v = (heads(h @ a[f"w{n}"] + a[f"b{n}"]) for n in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // HEADS)
    scores = scores + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    att = (p / p.sum(-1, keepdims=True)) @ v
    r1 = a["x"] + att.transpose(0, 2, 1, 3).reshape(b, s, D) @ a["wo"] + a["bo"]
    f = gelu(ln(r1, a["g2"], a["e2"]) @ a["w1"] + a["b1"]) @ a["w2"] + a["b2"]
    return r1 + f


# -- placing, partitioning and running ----------------------------------------------------------

def placed(text: str) -> Module:
    """The program with every value placed and redistributes expanded (global types)."""
    module = parse_module(text)
    run_pipeline(module, SPMD)
    return verify(module)


def partitioned(module: Module) -> Module:
    """The per-rank program of a placed module (a copy; `module` is left as it is)."""
    from tilefold.ir import print_module

    copy = parse_module(print_module(module))
    run_pipeline(copy, "spmd-partition")
    return verify(copy)


def run_spmd(global_: Module, per_rank: Module, arrays, rng=None) -> list[np.ndarray]:
    """Cut global inputs by the placed program's argument types, run the per-rank program on
    every rank, and assemble its outputs by the placed program's result types."""
    fn = global_["main"]
    mesh = next(v.type.sharding.mesh for v in fn.args if v.type.sharding is not None)
    blocks = [split(np.asarray(a), p.type, mesh, rng) for a, p in zip(arrays, fn.args,
                                                                       strict=True)]
    outs = run_ranks(per_rank, blocks)
    return [join(b, t) for b, t in zip(outs, fn.result_types, strict=True)]


# -- a LLaMA-style block: RMSNorm, grouped-query attention, SwiGLU -----------------------------

KV_HEADS, FFN = 2, 96
LLAMA_ARGS = ("x", "g1", "wq", "wk", "wv", "wo", "g2", "w1", "w3", "w2")
LLAMA_TP = {"x": "R", "g1": "R", "g2": "R", "wq": "S(1)", "wk": "S(1)", "wv": "S(1)",
            "wo": "S(0)", "w1": "S(1)", "w3": "S(1)", "w2": "S(0)"}


def llama_shapes(batch: int, seq: int) -> dict[str, tuple[int, ...]]:
    e = D // HEADS
    return {"x": (batch, seq, D), "g1": (D,), "g2": (D,), "wq": (D, D),
            "wk": (D, KV_HEADS * e), "wv": (D, KV_HEADS * e), "wo": (D, D),
            "w1": (D, FFN), "w3": (D, FFN), "w2": (FFN, D)}


def llama_text(mesh: str, batch: int = 4, seq: int = 4, dt: str = "f64") -> str:
    """x + o(gqa(rms1(x))), then + w2(silu(w1 h) * w3 h) with h = rms2(.); 4 query heads
    share 2 key/value heads."""
    _, roles = MESHES[mesh]
    e, shapes = D // HEADS, llama_shapes(batch, seq)

    def ty(shape) -> str:
        return f"{dt}[{','.join(map(str, shape))}]"

    def at(name: str) -> str:
        each = [("S(0)" if name == "x" else "R") if r == "d" else LLAMA_TP[name] for r in roles]
        return f"@m[{','.join(each)}]"

    sig = ",\n    ".join(f"%{n}: {ty(shapes[n])} {at(n)}" for n in LLAMA_ARGS)
    act, b, s = ty((batch, seq, D)), batch, seq
    lines = [f"%h1 = rms_norm(%x, %g1) : {act}"]
    for n, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
        lines += [f"%{n}0 = matmul(%h1, %w{n}) : {ty((b, s, heads * e))}",
                  f"%{n}1 = reshape(%{n}0) {{shape = [{b}, {s}, {heads}, {e}]}} : "
                  f"{ty((b, s, heads, e))}",
                  f"%{n} = transpose(%{n}1) {{perm = [0, 2, 1, 3]}} : {ty((b, heads, s, e))}"]
    lines += [f"%a0 = scaled_dot_product_attention(%q, %k, %v) {{is_causal = true, "
              f"enable_gqa = true}} : {ty((b, HEADS, s, e))}",
              f"%a1 = transpose(%a0) {{perm = [0, 2, 1, 3]}} : {ty((b, s, HEADS, e))}",
              f"%a2 = reshape(%a1) {{shape = [{b}, {s}, {D}]}} : {act}",
              f"%o = matmul(%a2, %wo) : {act}", f"%r1 = add(%x, %o) : {act}",
              f"%h2 = rms_norm(%r1, %g2) : {act}",
              f"%gate = matmul(%h2, %w1) : {ty((b, s, FFN))}",
              f"%up = matmul(%h2, %w3) : {ty((b, s, FFN))}",
              f"%act = silu(%gate) : {ty((b, s, FFN))}",
              f"%m = mul(%act, %up) : {ty((b, s, FFN))}",
              f"%d = matmul(%m, %w2) : {act}", f"%y = add(%r1, %d) : {act}", "return(%y)"]
    body = "\n  ".join(lines)
    return f"{mesh_line(mesh)}\nfunc @main(\n    {sig}) -> ({act}) {{\n  {body}\n}}"


def llama_inputs(rng: np.random.Generator, batch: int = 4, seq: int = 4, dt=np.float64):
    shapes = llama_shapes(batch, seq)
    return [(rng.standard_normal(shapes[n]) * (1.0 if n in ("x", "g1", "g2") else 0.2))
            .astype(dt) for n in LLAMA_ARGS]


def numpy_llama(*arrays: np.ndarray) -> np.ndarray:
    a = {n: np.asarray(v, np.float64) for n, v in zip(LLAMA_ARGS, arrays, strict=True)}
    b, s, _ = a["x"].shape
    e = D // HEADS

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g

    def heads(t, n):
        return t.reshape(b, s, n, e).transpose(0, 2, 1, 3)

    h = rms(a["x"], a["g1"])
    q = heads(h @ a["wq"], HEADS)
    k, v = (np.repeat(heads(h @ a[w], KV_HEADS), HEADS // KV_HEADS, axis=1) for w in ("wk", "wv"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(e) + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    att = ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b, s, D)
    r1 = a["x"] + att @ a["wo"]
    h2 = rms(r1, a["g2"])
    gate = h2 @ a["w1"]
    return r1 + (gate / (1 + np.exp(-gate)) * (h2 @ a["w3"])) @ a["w2"]
