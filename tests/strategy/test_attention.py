"""The fused attention kernel against the IR reference: masks, causal, GQA, odd lengths, views."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.strategy.attention_reference import attention64, cache_views, head_major
from tests.tolerances import assert_close
from tilefold.codegen.llvm.attention import AttentionConfig, attention_kernel
from tilefold.compiler import compile
from tilefold.ir import interpret, parse_module
from tilefold.ir.ops.attention import AttentionForward, ScaledDotProductAttention
from tilefold.target import host_target

RNG = np.random.default_rng(3)
CASES = [  # batch, heads, kv heads, queries, keys, e, ev, mask, causal
    (2, 3, 3, 5, 7, 8, 8, "none", False),
    (2, 4, 2, 70, 130, 32, 32, "bool", False),  # GQA, a partial last key block
    (1, 2, 2, 65, 65, 64, 40, "float", True),  # Ev not a multiple of the vector width
    (2, 2, 1, 3, 100, 16, 16, "bool", True),  # more keys than queries: top-left causal
    (1, 1, 1, 1, 1, 4, 4, "none", False),
]


def _reference(q, k, v, mask, **attrs):
    args = [q, k, v] + ([mask] if mask is not None else [])
    return ScaledDotProductAttention.reference(args, attrs)


@pytest.mark.parametrize(("threads", "registers"), [(1, 16), (2, 16), (1, 32), (2, 32)])
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(case, threads, registers):
    """Both register tiles (16 registers: 6 rows x 2 key vectors; 32: 4 x 4) on every tail."""
    b, h, hk, lq, lk, e, ev, mask_kind, causal = case
    target = host_target()
    kernel = attention_kernel(AttentionConfig(e, ev, mask_kind, causal, target.vector_bits // 32,
                                              threads, registers), target)
    q = RNG.standard_normal((b, h, lq, e), np.float32)
    k = RNG.standard_normal((b, hk, lk, e), np.float32)
    v = RNG.standard_normal((b, hk, lk, ev), np.float32)
    mask = None
    if mask_kind == "bool":
        mask = RNG.random((b, 1, lq, lk)) > 0.3
        mask[0, 0, 0] = False  # a row with every key masked gives zeros
    elif mask_kind == "float":
        mask = RNG.standard_normal((1, h, lq, lk)).astype(np.float32)
    out = np.full((b, h, lq, ev), np.nan, np.float32)
    scale = 1 / math.sqrt(e)
    kernel(q, k, v, mask, out, scale)
    want = _reference(q, k, v, mask, is_causal=causal, scale=scale, enable_gqa=hk != h)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize(("threads", "registers"), [(2, 16), (1, 32)])
@pytest.mark.parametrize("case", [c for c in CASES if c[1] == c[2] and c[7] != "bool"])
def test_kernel_gives_the_log_sum_exp(case, threads, registers):
    """`AttentionConfig.lse` (attention_forward's): the output as without it, and each row's
    log-sum-exp, -inf where the mask keeps no key, written through a strided view."""
    b, h, _, lq, lk, e, ev, mask_kind, causal = case
    target = host_target()
    kernel = attention_kernel(AttentionConfig(e, ev, mask_kind, causal, target.vector_bits // 32,
                                              threads, registers, lse=True), target)
    q = RNG.standard_normal((b, h, lq, e), np.float32)
    k = RNG.standard_normal((b, h, lk, e), np.float32)
    v = RNG.standard_normal((b, h, lk, ev), np.float32)
    mask = None
    if mask_kind == "float":
        mask = np.where(RNG.random((1, h, lq, lk)) > 0.2, RNG.standard_normal((1, h, lq, lk)),
                        -np.inf).astype(np.float32)
        mask[0, 0, 0] = -np.inf
    out = np.full((b, h, lq, ev), np.nan, np.float32)
    lse = np.full((b, h, lq, 2), np.nan, np.float32)
    kernel(q, k, v, mask, out, 1 / math.sqrt(e), lse[..., 1])
    args = [q, k, v] + ([mask] if mask is not None else [])
    if causal:
        tri = np.where(np.tril(np.ones((lq, lk), bool)), 0, -np.inf).astype(np.float32)
        args = [q, k, v, tri if mask is None else mask + tri]
    want_out, want_lse = AttentionForward.reference(args, {"scale": 1 / math.sqrt(e)})
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse[..., 1], want_lse, rtol=1e-5, atol=2e-6)
    assert np.isnan(lse[..., 0]).all()


def test_strided_views_in_and_out():
    """Heads split out of a [b, s, h*d] projection, output written head-transposed."""
    target = host_target()
    kernel = attention_kernel(AttentionConfig(8, 8, "none", False, target.vector_bits // 32, 2),
                              target)
    qkv = RNG.standard_normal((2, 9, 3 * 16), np.float32)
    q, k, v = (qkv[..., i * 16:(i + 1) * 16].reshape(2, 9, 2, 8).transpose(0, 2, 1, 3)
               for i in range(3))
    out = np.empty((2, 9, 2, 8), np.float32)
    kernel(q, k, v, None, out.transpose(0, 2, 1, 3), 0.3)
    want = _reference(q, k, v, None, is_causal=False, scale=0.3, enable_gqa=False)
    np.testing.assert_allclose(out.transpose(0, 2, 1, 3), want, rtol=1e-5, atol=2e-6)


ATTENTION = """func @main(%x: f32[?b,?s,32], %m: bool[?b,1,?s,?s]) -> (f32[?b,?s,32]) {
  %q = reshape(%x) {shape = [?b,?s,4,8]} : f32[?b,?s,4,8]
  %qt = transpose(%q) {perm = [0,2,1,3]} : f32[?b,4,?s,8]
  %e = exp(%qt) : f32[?b,4,?s,8]
  %o = scaled_dot_product_attention(%qt, %e, %qt, %m) : f32[?b,4,?s,8]
  %ot = transpose(%o) {perm = [0,2,1,3]} : f32[?b,?s,4,8]
  %y = reshape(%ot) {shape = [?b,?s,32]} : f32[?b,?s,32]
  return(%y)
}"""


def test_compiled_graph_runs_attention_natively_on_views():
    module = parse_module(ATTENTION)
    graph = compile(module)
    for b, s in ((2, 5), (1, 33)):  # symbolic dims in the reshape attributes
        x = RNG.standard_normal((b, s, 32)).astype(np.float32)
        m = RNG.random((b, 1, s, s)) > 0.2
        np.testing.assert_allclose(graph(x, m)[0], interpret(module, x, m)[0], rtol=1e-5,
                                   atol=2e-6)
    plan = graph.plan_for((1, 33, 32), (1, 1, 33, 33))
    methods = [d.winner.method for d in plan.decisions]
    assert "handwritten.attention" in methods
    assert set(plan.layout.values()) == {"view"}  # no copies around the attention kernel


@pytest.mark.parametrize("registers", [16, 32])
@pytest.mark.parametrize(("mask_kind", "causal"), [("bool", False), ("float", False),
                                                   ("bool", True)])
def test_prefill_skips_the_blocks_its_mask_excludes(registers, mask_kind, causal):
    """A static cache's prefill: 37 prompt rows against 300 positions, of which each batch
    entry's rows see a prefix (query i: keys j <= past + i). K and V hold NaN from the first
    key block no row sees; reading one would make the output NaN."""
    target = host_target()
    cfg = AttentionConfig(64, 64, mask_kind, causal, target.vector_bits // 32, 2, registers)
    kernel = attention_kernel(cfg, target)
    rng = np.random.default_rng(registers)
    lq, lk = 37, 300
    q = head_major(rng, 2, 6, lq, 64)
    k, v = cache_views(rng, 2, 3, lk, 64, 64)
    past = np.array([100, 40])
    seen = np.arange(lk)[None, None, None, :] <= (past[:, None] + np.arange(lq))[:, None, :, None]
    mask = seen if mask_kind == "bool" else np.where(seen, 0.5, -np.inf).astype(np.float32)
    want = attention64(q, k, v, mask, causal, 0.125)
    first_unseen = -(-(int(past.max()) + lq) // cfg.kb) * cfg.kb
    if causal:
        first_unseen = min(first_unseen, -(-lq // cfg.kb) * cfg.kb)
    assert first_unseen < lk
    k[..., first_unseen:, :] = v[..., first_unseen:, :] = np.nan
    out = np.full((2, 6, lq, 64), np.nan, np.float32)
    kernel(q, k, v, mask, out, 0.125)
    assert_close(out, want, dtype="f32", reduced=64 + lk)
