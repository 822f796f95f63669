"""The fused attention backward (`attention_backward`, and `attention_forward` compiled) against
the op's reference (itself checked
against PyTorch's autograd in `tests/ir/test_ir_ops_attention.py`) on every tail (key and query
blocks, features not a whole vector, both register tiles, one and two threads), masked rows,
views, and the op compiled strict from the IR."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold.codegen.llvm.attention import BackwardConfig, backward_kernel
from tilefold.compiler import compile
from tilefold.ir import interpret, parse_module
from tilefold.ir.ops.attention import AttentionBackward
from tilefold.target import host_target

CASES = [  # batch, heads, queries, keys, e, ev, bias
    (2, 3, 7, 9, 8, 8, True),
    (2, 2, 70, 130, 32, 32, True),  # a partial query block and key block
    (1, 2, 65, 65, 20, 40, False),  # features not a whole vector
    (1, 2, 130, 67, 64, 48, True),
    (1, 1, 1, 1, 4, 4, False),
    (1, 1, 3, 200, 128, 16, True),  # more keys than queries, wide features
]


def _inputs(rng, b, h, lq, lk, e, ev, bias, dtype=np.float32):
    """dout, q, k, v, lse, delta and a bias (or None) as a forward would leave them: lse the
    log-sum-exp of each row's scaled, biased scores (-inf where the bias masks the row whole),
    delta random (the kernel takes it as given)."""
    q = rng.standard_normal((b, h, lq, e)).astype(dtype)
    k = rng.standard_normal((b, h, lk, e)).astype(dtype)
    v = rng.standard_normal((b, h, lk, ev)).astype(dtype)
    dout = rng.standard_normal((b, h, lq, ev)).astype(dtype)
    delta = rng.standard_normal((b, h, lq)).astype(dtype)
    mask = None
    scores = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(e)
    if bias:
        mask = np.where(rng.random((b, 1, lq, lk)) > 0.2, rng.standard_normal((b, 1, lq, lk)),
                        -np.inf).astype(dtype)
        mask[..., 0] = 0.0
        if lq > 1:
            mask[0, 0, 1] = -np.inf  # a row that keeps no key: zero gradients from it
        scores = scores + mask
    top = scores.max(-1, keepdims=True)
    with np.errstate(all="ignore"):
        total = np.exp(scores - np.where(np.isfinite(top), top, 0)).sum(-1, keepdims=True)
        lse = np.where(total > 0, np.log(total) + top, -np.inf)[..., 0]
    return dout, q, k, v, lse.astype(dtype), delta, mask


def _reference(dout, q, k, v, lse, delta, mask, scale):
    args = [dout, q, k, v, lse, delta] + ([mask] if mask is not None else [])
    return AttentionBackward.reference(args, {"scale": scale})


@pytest.mark.parametrize(("threads", "registers"), [(1, 16), (2, 16), (1, 32), (2, 32)])
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(case, threads, registers):
    _, _, lq, lk, e, ev, bias = case
    target = host_target()
    kernel = backward_kernel(BackwardConfig(e, ev, bias, target.vector_bits // 32, threads,
                                            registers), target)
    rng = np.random.default_rng(sum(case))
    dout, q, k, v, lse, delta, mask = _inputs(rng, *case)
    scale = 1 / math.sqrt(e)
    outs = [np.full(x.shape, np.nan, np.float32) for x in (q, k, v)]
    kernel(dout, q, k, v, lse, delta, mask, *outs, scale)
    want = _reference(dout, q, k, v, lse, delta, mask, scale)
    for got, w in zip(outs, want, strict=True):
        assert_close(got, w, dtype="f32", reduced=max(lq, lk) * max(e, ev),
                     scale=np.abs(w).max())


def test_views_in_and_out():
    """Heads split out of [b, s, h*d] projections, gradients written head-transposed, a
    transposed (column-major) bias and delta/lse as strided views."""
    target = host_target()
    kernel = backward_kernel(BackwardConfig(8, 8, True, target.vector_bits // 32, 2), target)
    rng = np.random.default_rng(9)
    dout, _, _, _, lse, delta, mask = _inputs(rng, 2, 2, 9, 9, 8, 8, True)
    qkv = rng.standard_normal((2, 9, 3 * 16)).astype(np.float32)
    q, k, v = (qkv[..., i * 16:(i + 1) * 16].reshape(2, 9, 2, 8).transpose(0, 2, 1, 3)
               for i in range(3))
    mask_t = np.ascontiguousarray(np.swapaxes(mask, -1, -2)).swapaxes(-1, -2)
    lse_v = np.repeat(lse[..., None], 2, -1)[..., 0]
    outs = [np.full((2, 9, 2, 8), np.nan, np.float32) for _ in range(3)]
    kernel(dout, q, k, v, lse_v, delta, mask_t, *(o.transpose(0, 2, 1, 3) for o in outs), 0.3)
    want = _reference(dout, q, k, v, lse, delta, mask, 0.3)
    for got, w in zip(outs, want, strict=True):
        assert_close(got.transpose(0, 2, 1, 3), w, dtype="f32", reduced=72,
                     scale=np.abs(w).max())


T = "f32[?b,4,?s,16]"
ROWS = "f32[?b,4,?s]"
BACKWARD = f"""func @main(%do: {T}, %q: {T}, %k: {T}, %v: {T}, %lse: {ROWS}, %d: {ROWS},
                 %m: f32[?b,1,?s,?s]) -> ({T}, {T}, {T}) {{
  %dq, %dk, %dv = attention_backward(%do, %q, %k, %v, %lse, %d, %m) {{scale = 0.25}}
    : ({T}, {T}, {T})
  return(%dq, %dk, %dv)
}}"""


@pytest.mark.parametrize(("b", "s"), [(1, 5), (2, 77)])
def test_compiled_op_runs_the_kernel(b, s, monkeypatch):
    """Symbolic batch and length: the op compiles (strict) to the hand-written method and
    matches the interpreter."""
    monkeypatch.setenv("TILEFOLD_STRICT", "1")
    module = parse_module(BACKWARD)
    compiled = compile(module)
    rng = np.random.default_rng(s)
    dout, q, k, v, lse, delta, mask = _inputs(rng, b, 4, s, s, 16, 16, True)
    args = [dout, q, k, v, lse, delta, mask]
    got = compiled(*args)
    want = interpret(module, *args)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, dtype="f32", reduced=s * 16, scale=np.abs(w).max())
    plan = compiled.plan_for(*(x.shape for x in args))
    assert [d.winner.method for d in plan.decisions] == ["handwritten.attention_backward"]


FORWARD = f"""func @main(%q: {T}, %k: {T}, %v: {T}, %m: f32[?b,1,?s,?s]) -> ({T}, {ROWS}) {{
  %o, %lse = attention_forward(%q, %k, %v, %m) {{scale = 0.25}} : ({T}, {ROWS})
  return(%o, %lse)
}}"""


@pytest.mark.parametrize(("b", "s"), [(1, 5), (2, 77)])
def test_compiled_forward_runs_the_kernel(b, s, monkeypatch):
    """attention_forward, the backward's partner, likewise: the flash kernel with its
    log-sum-exp, against the interpreter."""
    monkeypatch.setenv("TILEFOLD_STRICT", "1")
    module = parse_module(FORWARD)
    compiled = compile(module)
    rng = np.random.default_rng(s)
    _, q, k, v, _, _, mask = _inputs(rng, b, 4, s, s, 16, 16, True)
    got = compiled(q, k, v, mask)
    want = interpret(module, q, k, v, mask)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, dtype="f32", reduced=s * 16, scale=np.abs(w[np.isfinite(w)]).max())
    plan = compiled.plan_for(q.shape, k.shape, v.shape, mask.shape)
    assert [d.winner.method for d in plan.decisions] == ["handwritten.attention_forward"]
