"""`tilefold generate`'s arithmetic (cli/llm_metrics.py): perplexity and KL divergence against a
direct float64 NumPy computation, bytes per token against what the quantize-weights pass stores,
the KV cache and GGUF sizes against hand counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tilefold.cli import llm_metrics as m
from tilefold.cli.llm_metrics import Weight
from tilefold.ir import Builder
from tilefold.passes import PassManager

RNG = np.random.default_rng(34)


def _direct_log_probs(row: np.ndarray) -> np.ndarray:
    """log softmax of one row, float64, written out without the module's helpers."""
    x = row.astype(np.float64)
    top = x.max()
    return x - top - math.log(sum(math.exp(v - top) for v in x))


# T crosses the module's 64-row chunks; V prime; large logits test the max shift
@pytest.mark.parametrize("positions,vocab,scale", [(2, 5, 1.0), (37, 53, 3.0), (131, 97, 40.0)])
def test_perplexity_is_exp_of_the_mean_negative_log_likelihood(positions, vocab, scale):
    logits = (scale * RNG.standard_normal((positions, vocab))).astype(np.float32)
    tokens = RNG.integers(0, vocab, positions).tolist()
    nll = [-_direct_log_probs(logits[t])[tokens[t + 1]] for t in range(positions - 1)]
    want = math.exp(sum(nll) / len(nll))
    assert m.perplexity(logits, tokens) == pytest.approx(want, rel=1e-12)


def test_uniform_logits_have_the_vocabulary_as_perplexity():
    assert m.perplexity(np.zeros((9, 31), np.float32), list(range(9))) == pytest.approx(31.0)


@pytest.mark.parametrize("positions,vocab", [(2, 7), (70, 41)])
def test_kl_divergence_and_top1_against_direct_float64(positions, vocab):
    ref = (3 * RNG.standard_normal((positions, vocab))).astype(np.float32)
    got = (ref + 0.5 * RNG.standard_normal((positions, vocab))).astype(np.float32)
    tokens = list(range(positions))
    kls, same = [], 0
    for t in range(positions - 1):
        p, q = _direct_log_probs(ref[t]), _direct_log_probs(got[t])
        kls.append(float(np.sum(np.exp(p) * (p - q))))
        same += int(np.argmax(ref[t]) == np.argmax(got[t]))
    found = m.agreement(ref, got, tokens)
    assert found.kl_mean == pytest.approx(np.mean(kls), rel=1e-10)
    assert found.kl_max == pytest.approx(max(kls), rel=1e-10)
    assert found.top1 == same / (positions - 1)
    assert 0 < found.kl_mean <= found.kl_max
    alike = m.agreement(ref, ref, tokens)
    assert (alike.kl_mean, alike.kl_max, alike.top1) == (0.0, 0.0, 1.0)


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="T >= 2"):
        m.perplexity(np.zeros((1, 4)), [0])
    with pytest.raises(ValueError, match="for 3 tokens"):
        m.perplexity(np.zeros((2, 4)), [0, 1, 2])
    with pytest.raises(ValueError, match="reference"):
        m.agreement(np.zeros((3, 4)), np.zeros((3, 5)), [0, 1, 2])


# ---- bytes ----------------------------------------------------------------------------------

# [N, K]: quantized by both formats; too small; K odd (f32 for both); K even but not a whole
# number of int4 groups (int8 only)
SHAPES = [(96, 64), (60, 64), (96, 49), (96, 48)]


def _stored_by_the_pass(fmt: str) -> list[int]:
    """Bytes of each weight after quantize-weights (its defaults), as the IR holds them: codes
    at their dtype's bits, f32 scales, or the f32 constant left alone."""
    b = Builder("main")
    outs = [b.op("matmul", b.arg(f"x{i}", "f32", (1, k)),
                 b.constant(RNG.standard_normal((n, k)).astype(np.float32)), transpose_b=True)
            for i, (n, k) in enumerate(SHAPES)]
    module = PassManager(f"quantize-weights{{format={fmt}}},dce").run(b.build(*outs))
    sizes = []
    for op in (op for op in module.walk() if op.name == "matmul"):
        w = op.operands[1].defining_op
        if w.name == "dequantize":
            codes = w.operands[0].defining_op.attrs["value"]
            scale = w.operands[1].defining_op.attrs["value"]
            bits = 4 if str(codes.dtype) == "int4" else 8 * codes.itemsize
            sizes.append(codes.size * bits // 8 + scale.nbytes)
        else:
            sizes.append(w.attrs["value"].nbytes)
    return sizes


@pytest.mark.parametrize("fmt", ["f32", "int8", "int4"])
def test_matmul_bytes_are_what_the_pass_stores(fmt):
    want = [n * k * 4 for n, k in SHAPES] if fmt == "f32" else _stored_by_the_pass(fmt)
    assert [m.matmul_bytes(Weight("w", s, "matmul"), fmt) for s in SHAPES] == want
    if fmt != "f32":
        assert [m.quantized(Weight("w", s, "matmul"), fmt) for s in SHAPES] == \
            ([True, False, False, True] if fmt == "int8" else [True, False, False, False])


def test_a_token_reads_matmul_weights_whole_and_one_embedding_row():
    vocab, hidden = 320, 64
    weights = [Weight("embed", (vocab, hidden), "gather", "embed"),
               Weight("q", (hidden, hidden), "matmul"),
               Weight("norm", (hidden,), "other"),
               Weight("lm_head", (vocab, hidden), "matmul", "embed")]  # tied to the embedding
    row, norm = hidden * 4, hidden * 4
    assert m.weight_bytes_per_token(weights, "f32") == \
        row + hidden * hidden * 4 + norm + vocab * hidden * 4
    int4 = m.weight_bytes_per_token(weights, "int4")
    assert int4 == row + hidden * hidden // 2 + hidden * 2 * 4 + norm \
        + vocab * hidden // 2 + vocab * 2 * 4
    # held once each: the tied table at its quantized size
    assert m.weight_bytes_stored(weights, "int8") == \
        (vocab * hidden + vocab * 4) + (hidden * hidden + hidden * 4) + norm
    assert m.weight_bytes_stored(weights, "f32") == (vocab * hidden + hidden * hidden) * 4 + norm
    with pytest.raises(ValueError, match="weight format"):
        m.weight_bytes_per_token(weights, "int2")


def test_gguf_bytes_count_the_embedding_once_as_a_row_twice_when_tied():
    tensors = [("token_embd.weight", 49152 * 34, 49152), ("blk.0.attn_q.weight", 1000, 8),
               ("output_norm.weight", 2304, 576)]
    tied = m.gguf_bytes_per_token(tensors)
    assert tied == 49152 * 34 + 1000 + 2304 + 34
    untied = m.gguf_bytes_per_token([*tensors, ("output.weight", 5000, 49152)])
    assert untied == 1000 + 2304 + 34 + 5000


def test_kv_cache_context_and_bandwidth_share():
    # SmolLM2: 30 layers, 3 KV heads of 64; f32 at 320 positions
    assert m.kv_bytes(30, 3, 64, 320, 4) == 2 * 30 * 3 * 64 * 320 * 4
    assert m.mean_decode_context(256, 128) == 320
    assert m.bandwidth_share(50.0, 538e6, 40.0) == pytest.approx(50 * 538e6 / 40e9)
