"""Fused transformer blocks: tilefold vs NumPy, PyTorch eager and torch.compile in one run.

Blocks: the MLP gelu(x@W1+b1)@W2+b2 (x 128x768 and 1024x768, hidden 3072), layer_norm of a
residual sum, softmax over attention scores (12x128x128, 12x512x512) and a BERT-base encoder
layer (seq 128). Weights are graph constants (tilefold pre-packs them). Each round times every
contender once after warm-up calls, in turn, with BLAS/OpenMP threads limited to the same count,
tilefold's workers parked before a peer runs and a pause for spinning threads to settle; then
each contender runs alone. The figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefold.cli.benchutil import Bench, Row, Section, Suite

SETTLE_SECONDS = 0.02  # one call a sample here, so a shorter pause than the GEMM's blocks
MISMATCH_RTOL = 1e-3
HEADS, HIDDEN, FFN = 12, 768, 3072


@dataclass
class Block:
    name: str
    graph: Callable  # (builder, rng) -> (module, inputs, numpy_fn, torch_fn)


def _mlp(rows: int):
    def build(rng):
        from tilefold.ir import Builder

        w1 = (rng.standard_normal((HIDDEN, FFN)) * 0.02).astype(np.float32)
        w2 = (rng.standard_normal((FFN, HIDDEN)) * 0.02).astype(np.float32)
        b1, b2 = (rng.standard_normal(n).astype(np.float32) for n in (FFN, HIDDEN))
        b = Builder()
        x = b.arg("x", "f32", (rows, HIDDEN))
        h = b.op("gelu", b.op("add", b.op("matmul", x, b.constant(w1)), b.constant(b1)))
        y = b.op("add", b.op("matmul", h, b.constant(w2)), b.constant(b2))
        module = b.build(y)
        xs = [rng.standard_normal((rows, HIDDEN)).astype(np.float32)]

        def torch_fn(t):
            import torch.nn.functional as F

            return F.gelu(t @ tw1 + tb1) @ tw2 + tb2

        tw1, tw2, tb1, tb2 = _torch(w1, w2, b1, b2)
        return module, xs, torch_fn
    return build


def _torch(*arrays):
    import torch

    return [torch.from_numpy(a) for a in arrays]


def _layer_norm(rows: int):
    def build(rng):
        from tilefold.ir import Builder

        w, bias = (rng.standard_normal(HIDDEN).astype(np.float32) for _ in range(2))
        b = Builder()
        x, r = b.arg("x", "f32", (rows, HIDDEN)), b.arg("r", "f32", (rows, HIDDEN))
        module = b.build(b.op("layer_norm", b.op("add", x, r), b.constant(w), b.constant(bias)))
        xs = [rng.standard_normal((rows, HIDDEN)).astype(np.float32) for _ in range(2)]
        tw, tb = _torch(w, bias)

        def torch_fn(tx, tr):
            import torch.nn.functional as F

            return F.layer_norm(tx + tr, (HIDDEN,), tw, tb)
        return module, xs, torch_fn
    return build


def _softmax(seq: int):
    def build(rng):
        from tilefold.ir import Builder

        b = Builder()
        x = b.arg("s", "f32", (HEADS, seq, seq))
        module = b.build(b.op("softmax", x))
        xs = [rng.standard_normal((HEADS, seq, seq)).astype(np.float32) * 3]

        def torch_fn(t):
            import torch

            return torch.softmax(t, -1)
        return module, xs, torch_fn
    return build


def _encoder(seq: int):
    def build(rng):
        from tilefold.ir import Builder

        def weight(*shape):
            return (rng.standard_normal(shape) * 0.02).astype(np.float32)

        ws = {k: weight(HIDDEN, HIDDEN) for k in ("q", "k", "v", "o")}
        w1, w2 = weight(HIDDEN, FFN), weight(FFN, HIDDEN)
        ln = [rng.standard_normal(HIDDEN).astype(np.float32) for _ in range(4)]
        dh = HIDDEN // HEADS
        b = Builder()
        x = b.arg("x", "f32", (seq, HIDDEN))

        def heads(t):
            return b.op("transpose", b.op("reshape", t, shape=(seq, HEADS, dh)), perm=(1, 0, 2))

        q, k, v = (heads(b.op("matmul", x, b.constant(ws[n]))) for n in "qkv")
        scores = b.op("mul", b.op("matmul", q, k, transpose_b=True),
                      b.constant(np.float32(1 / math.sqrt(dh))))
        ctx = b.op("matmul", b.op("softmax", scores), v)
        ctx = b.op("reshape", b.op("transpose", ctx, perm=(1, 0, 2)), shape=(seq, HIDDEN))
        h = b.op("layer_norm", b.op("add", b.op("matmul", ctx, b.constant(ws["o"])), x),
                 b.constant(ln[0]), b.constant(ln[1]))
        f = b.op("matmul", b.op("gelu", b.op("matmul", h, b.constant(w1))), b.constant(w2))
        y = b.op("layer_norm", b.op("add", f, h), b.constant(ln[2]), b.constant(ln[3]))
        module = b.build(y)
        xs = [rng.standard_normal((seq, HIDDEN)).astype(np.float32)]
        t = dict(zip(ws, _torch(*ws.values()), strict=True))
        tw1, tw2, *tln = _torch(w1, w2, *ln)

        def torch_fn(tx):
            import torch
            import torch.nn.functional as F

            def th(u):
                return u.reshape(seq, HEADS, dh).transpose(0, 1)

            q, k, v = (th(tx @ t[n]) for n in "qkv")
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), -1) @ v
            a = a.transpose(0, 1).reshape(seq, HIDDEN)
            hh = F.layer_norm(a @ t["o"] + tx, (HIDDEN,), tln[0], tln[1])
            return F.layer_norm(F.gelu(hh @ tw1) @ tw2 + hh, (HIDDEN,), tln[2], tln[3])
        return module, xs, torch_fn
    return build


BLOCKS = [
    Block("mlp-128x768", _mlp(128)),
    Block("mlp-1024x768", _mlp(1024)),
    Block("ln-residual-2048x768", _layer_norm(2048)),
    Block("softmax-12x128x128", _softmax(128)),
    Block("softmax-12x512x512", _softmax(512)),
    Block("encoder-seq128", _encoder(128)),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", default=[], help="blocks whose name has this")
    parser.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile")


def run(args: argparse.Namespace, bench: Bench) -> int:
    (threads,) = args.thread_counts
    os.environ["TILEFOLD_NUM_THREADS"] = str(threads)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    section = Section(f"threads={threads}, medians of {args.rounds} rounds",
                      f"{'block':<24}", "ms", threads=threads)
    with threadpool_limits(limits=threads):
        for block in BLOCKS:
            if args.only and not any(s in block.name for s in args.only):
                continue
            section.rows.append(_bench_block(block, rng, args, bench))
    bench.table(section)
    return 0


def _bench_block(block: Block, rng: np.random.Generator, args: argparse.Namespace,
                 bench: Bench) -> Row:
    import torch

    from tilefold.compiler import compile

    module, xs, torch_fn = block.graph(rng)
    graph = compile(module)
    txs = _torch(*xs)
    contenders = {"tilefold": lambda: graph(*xs),
                  "numpy": _numpy_contender(block, module, xs),
                  "eager": lambda: torch_fn(*txs)}
    if not args.no_torch_compile:
        compiled = torch.compile(torch_fn)
        contenders["compile"] = lambda: compiled(*txs)
    want = torch_fn(*txs).numpy()
    err = float(np.abs(graph(*xs)[0] - want).max() / (np.abs(want).max() or 1.0))
    timings = bench.measure(contenders, settle=SETTLE_SECONDS)
    note = f"  MISMATCH vs eager {err:.1e}" if err > MISMATCH_RTOL else ""
    return Row(block.name, f"{block.name:<24}", timings, note=note,
               info={"max_rel_err_vs_eager": err})


def _numpy_contender(block: Block, module, xs) -> Callable:
    """NumPy written by hand (f32, one call per op), not the f64 reference interpreter."""
    from tilefold.strategy import Problem
    from tilefold.strategy.methods.extern import NUMPY, build_extern

    fn = module["main"]
    ops = [op for op in fn.ops if op.name not in ("constant", "return")]
    env_kernels = []
    for op in ops:
        shapes = [tuple(v.type.shape) for v in op.operands]
        problem = Problem.of(op, shapes)
        env_kernels.append((build_extern(problem, {**NUMPY, **_numpy_extras()}), op))
    consts = {op.result: op.attrs["value"] for op in fn.ops if op.name == "constant"}

    def run():
        env = dict(consts)
        env.update(zip(fn.args, xs, strict=True))
        for kernel, op in env_kernels:
            outs = [np.empty(tuple(r.type.shape), r.type.dtype.np_dtype) for r in op.results]
            kernel.run(*(env[v] for v in op.operands), *outs, *kernel.scratch_arrays())
            env.update(zip(op.results, outs, strict=True))
        return env[fn.outputs[0]]
    return run


def _layer_norm_np(x, w, b, attrs):
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / np.sqrt(var + np.float32(attrs["eps"])) * w + b


def _numpy_extras() -> dict:
    """f32 NumPy versions of what the extern table leaves to the reference (erf via SciPy)."""
    extras = {"layer_norm": _layer_norm_np}
    try:
        import scipy.special as sp
    except ImportError:
        return extras
    return {**extras, "gelu": lambda x, attrs: (
        0.5 * x * (1 + sp.erf(x * np.float32(0.7071067811865476)))).astype(x.dtype)}


SUITE = Suite("blocks", __doc__, add_arguments, run, rounds=15, threads="2")
