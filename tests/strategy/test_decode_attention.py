"""The decode attention kernel against float64 NumPy: few query rows, long caches, GQA, masks,
thread splits, blocks it must skip without reading, AVX2 and AVX-512; and in compiled graphs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.strategy.attention_reference import (
    attention64,
    cache_views,
    head_major,
    make_mask,
    staircase,
)
from tests.tolerances import assert_close
from tilefold.codegen.llvm.attention import DecodeConfig, attention_kernel
from tilefold.compiler import compile
from tilefold.ir import parse_module
from tilefold.target import host_target

HOST = host_target()
# AVX-512 and AVX2 where the host has both (the AVX2 kernel runs on an AVX-512 host too).
TARGETS = {"host": HOST}
if HOST.vector_bits > 256:
    TARGETS["avx2"] = host_target("x86-64-v3")

CASES = [  # batch, heads, kv heads, query rows, keys, e, ev, mask, causal
    (1, 9, 3, 1, 80, 64, 64, "prefix", False),  # SmolLM2's decode step
    (1, 9, 3, 1, 2048, 64, 64, "prefix", False),
    (2, 8, 2, 4, 131, 128, 128, "prefix", False),  # GQA 4, head dim 128
    (1, 4, 4, 8, 257, 64, 64, "random", False),  # no GQA, 8 rows, rows keeping nothing
    (2, 6, 2, 3, 67, 20, 24, "float", True),  # E and Ev not multiples of the vector
    (1, 3, 1, 2, 1, 16, 16, "none", False),  # one key, every head on one kv head
    (2, 2, 2, 1, 0, 64, 64, "prefix", False),  # no keys: zeros
    (1, 12, 3, 5, 1031, 128, 64, "float", False),
    (3, 4, 4, 6, 127, 64, 64, "prefix", True),  # causal: rows see keys j <= i only
    (2, 9, 3, 7, 193, 64, 64, "random", True),
    (0, 9, 3, 1, 16, 64, 64, "none", False),  # no batch
]


def _config(target, e, ev, mask, causal, threads):
    return DecodeConfig(e, ev, mask, causal, target.vector_bits // 32, threads,
                        target.vector_registers)


def _run(target, threads, q, k, v, mask, causal, scale, out=None):
    kind = "none" if mask is None else "bool" if mask.dtype == np.bool_ else "float"
    cfg = _config(target, q.shape[-1], v.shape[-1], kind, causal, threads)
    if out is None:
        out = np.full((*q.shape[:-1], v.shape[-1]), np.nan, np.float32)
    attention_kernel(cfg, target)(q, k, v, mask, out, scale)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_decode_kernel_matches_float64(case, target, threads):
    b, h, hk, lq, lk, e, ev, kind, causal = case
    rng = np.random.default_rng(lk * 7 + lq)
    q = head_major(rng, b, h, lq, e)
    k, v = cache_views(rng, b, hk, lk, e, ev)
    mask = make_mask(rng, kind, b, h, lq, lk)
    scale = 1 / math.sqrt(e)
    out = np.full((b, lq, h, ev), np.nan, np.float32).transpose(0, 2, 1, 3)  # written in place
    _run(TARGETS[target], threads, q, k, v, mask, causal, scale, out)
    assert_close(out, attention64(q, k, v, mask, causal, scale), dtype="f32", reduced=e + lk)


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("valid", [0, 1, 63, 64, 65, 200, 511])
def test_masked_blocks_are_never_read(target, valid):
    """A static cache's decode step: K and V hold NaN from the first block past the valid
    prefix on, and a block in the middle that the mask excludes for every row too; a block
    read would make the output NaN (a key's NaN score is masked, but 0 * NaN is NaN in P V)."""
    rng = np.random.default_rng(valid)
    lk, kb = 512, _config(TARGETS[target], 64, 64, "bool", False, 1).kb
    q = rng.standard_normal((2, 9, 1, 64), np.float32)
    k, v = (rng.standard_normal((2, 3, lk, 64), np.float32) for _ in range(2))
    mask = np.zeros((2, 1, 1, lk), bool)
    mask[..., :valid] = True
    mask[1, ..., :valid // 2] = True  # a shorter second sequence
    mask[1, ..., valid // 2:] = False
    hole = slice(kb, 2 * kb)  # excluded for every row when the prefix passes it
    mask[..., hole] = False
    want = attention64(q, k, v, mask, False, 0.125)
    k[..., -(-valid // kb) * kb:, :] = np.nan
    v[..., -(-valid // kb) * kb:, :] = np.nan
    k[..., hole, :] = v[..., hole, :] = np.nan
    for threads in (1, 2):
        got = _run(TARGETS[target], threads, q, k, v, mask, False, 0.125)
        assert_close(got, want, dtype="f32", reduced=64 + lk)


def test_rows_sharing_one_mask_row_and_batches_with_their_own():
    """Masks broadcast over batch, heads or rows (stride 0) and masks per batch entry."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 8, 4, 64), np.float32)
    k, v = cache_views(rng, 3, 2, 300, 64, 64)
    for shape in ((1, 1, 1, 300), (3, 1, 1, 300), (1, 8, 1, 300), (3, 1, 4, 300), (300,)):
        mask = rng.random(shape) > 0.5
        mask[..., 130:] = False
        for threads in (1, 2):
            got = _run(HOST, threads, q, k, v, mask, False, 0.3)
            assert_close(got, attention64(q, k, v, mask, False, 0.3), dtype="f32", reduced=364)


MANY_THREADS = """
    import numpy as np
    from tests.strategy.attention_reference import attention64, staircase
    from tests.strategy.test_decode_attention import HOST, _run
    from tests.tolerances import assert_close
    rng = np.random.default_rng(0)
    # keys covering fewer, as many and more blocks than threads; groups split between threads,
    # threads with nothing to do, threads whose share ends in a group's first block
    for threads in (3, 4, 5):
        for b, h, hk, lq, lk in ((1, 9, 3, 1, 70), (1, 9, 3, 1, 400), (2, 4, 2, 2, 129),
                                 (1, 2, 1, 3, 700), (3, 3, 3, 1, 64)):
            q = rng.standard_normal((b, h, lq, 64), np.float32)
            k, v = (rng.standard_normal((b, hk, lk, 64), np.float32) for _ in range(2))
            mask = staircase(rng, b, lq, lk)[0]
            for m in (mask, None):
                got = _run(HOST, threads, q, k, v, m, False, 0.125)
                assert_close(got, attention64(q, k, v, m, False, 0.125), dtype="f32",
                             reduced=64 + lk)
    print("ok")
"""


def test_more_threads_than_cores_and_blocks():
    """Splits over 3 to 5 threads (a pool larger than this host's cores, workers sleeping
    between regions), in a fresh process whose pool has 5 threads."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "TILEFOLD_NUM_THREADS": "5", "TILEFOLD_SPIN_US": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(MANY_THREADS)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


DECODE_STEP = """func @main(%q: f32[1,9,1,64], %kc: f32[1,3,?s,64], %vc: f32[1,3,?s,64],
                     %m: bool[1,1,1,?s]) -> (f32[1,9,1,64]) {
  %0 = expand_dims(%kc) {axes = [2]} : f32[1,3,1,?s,64]
  %1 = broadcast_to(%0) {shape = [1, 3, 3, ?s, 64]} : f32[1,3,3,?s,64]
  %2 = reshape(%1) {shape = [1, 9, ?s, 64]} : f32[1,9,?s,64]
  %3 = expand_dims(%vc) {axes = [2]} : f32[1,3,1,?s,64]
  %4 = broadcast_to(%3) {shape = [1, 3, 3, ?s, 64]} : f32[1,3,3,?s,64]
  %5 = reshape(%4) {shape = [1, 9, ?s, 64]} : f32[1,9,?s,64]
  %6 = scaled_dot_product_attention(%q, %2, %5, %m) {scale = 0.125} : f32[1,9,1,64]
  return(%6)
}"""


def test_compiled_decode_step_reads_the_cache_directly():
    """Hugging Face's repeat_kv folds into grouped-query attention (canonicalize), so the step
    neither copies the cache nor repeats its heads; one query row takes the decode kernel, a
    prompt the flash kernel."""
    graph = compile(parse_module(DECODE_STEP))
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 9, 1, 64), np.float32)
    for length, valid in ((96, 40), (1024, 700)):
        kc, vc = (rng.standard_normal((1, 3, length, 64), np.float32) for _ in range(2))
        mask = np.zeros((1, 1, 1, length), bool)
        mask[..., :valid] = True
        assert_close(graph(q, kc, vc, mask)[0], attention64(q, kc, vc, mask, False, 0.125),
                     dtype="f32", reduced=64 + length)
        plan = graph.plan_for(q.shape, kc.shape, vc.shape, mask.shape)
        assert [d.winner.method for d in plan.decisions] == ["handwritten.decode_attention"]
        assert set(plan.layout.values()) <= {"view"}  # nothing copied: no repeated heads
    (sdpa,) = [op for op in graph.module.functions["main"].ops
               if op.name == "scaled_dot_product_attention"]
    assert [v.name for v in sdpa.operands[1:3]] == ["kc", "vc"]
    prompt = compile(parse_module(DECODE_STEP.replace("f32[1,9,1,64]", "f32[1,9,33,64]")
                                  .replace("bool[1,1,1,?s]", "bool[1,1,33,?s]")))
    mask, _ = staircase(rng, 1, 33, 96)
    q = rng.standard_normal((1, 9, 33, 64), np.float32)
    kc, vc = (rng.standard_normal((1, 3, 96, 64), np.float32) for _ in range(2))
    assert_close(prompt(q, kc, vc, mask)[0], attention64(q, kc, vc, mask, False, 0.125),
                 dtype="f32", reduced=64 + 96)
    plan = prompt.plan_for(q.shape, kc.shape, vc.shape, mask.shape)
    assert [d.winner.method for d in plan.decisions] == ["handwritten.attention"]


@pytest.mark.parametrize("rows", [1, 33])  # the decode kernel, the flash kernel
def test_a_compiled_step_replays_attention_as_one_native_call(rows):
    """Called again on the same arrays, the step records the attention kernel's native call and
    replays it (`compiler.Recording`): each answer follows the query, cache and mask as they
    are written in place between calls, as a generation loop writes them."""
    module = parse_module(DECODE_STEP.replace("f32[1,9,1,64]", f"f32[1,9,{rows},64]")
                          .replace("bool[1,1,1,?s]", f"bool[1,1,{rows},?s]"))
    graph = compile(module, strict=True)
    rng = np.random.default_rng(rows)
    length = 300
    q = rng.standard_normal((1, 9, rows, 64), np.float32)
    kc, vc = (rng.standard_normal((1, 3, length, 64), np.float32) for _ in range(2))
    mask = np.zeros((1, 1, rows, length), bool)
    for step, valid in enumerate((70, 71, 72, 200, 129)):
        mask[...] = False
        mask[..., :valid] = True
        q[...] = rng.standard_normal(q.shape)
        kc[:, :, valid - 1] = rng.standard_normal((1, 3, 64))  # this step's key and value
        vc[:, :, valid - 1] = rng.standard_normal((1, 3, 64))
        (got,) = graph(q, kc, vc, mask)
        assert_close(got, attention64(q, kc, vc, mask, False, 0.125), dtype="f32",
                     reduced=64 + length)
        if step:
            (plan,) = graph._plans.values()
            assert plan.replay is not None and plan.replay.matches((q, kc, vc, mask))
            assert plan.replay.native_steps == len(plan.steps) == 1
            assert [type(s).__name__ for s in plan.replay.segments] == ["Replay"]
    method = "handwritten.decode_attention" if rows == 1 else "handwritten.attention"
    assert [d.winner.method for d in plan.decisions] == [method]


def test_operands_the_kernel_would_copy_are_not_recorded():
    """A K or V whose rows are not contiguous, or an output with a stride, is copied before
    the call (or after it): such a call has no native call to record, and runs right."""
    rng = np.random.default_rng(9)
    cfg = _config(HOST, 64, 64, "none", False, 1)
    kernel = attention_kernel(cfg, HOST)
    q = rng.standard_normal((1, 4, 1, 64), np.float32)
    k, v = (rng.standard_normal((1, 2, 100, 64), np.float32) for _ in range(2))
    out = np.full((1, 4, 1, 64), np.nan, np.float32)
    assert kernel.calls(q, k, v, None, out, 0.125) is not None
    strided_k = np.asfortranarray(k)
    wide = np.full((1, 4, 1, 128), np.nan, np.float32)
    for args in ((q, strided_k, v, out), (q, k, np.asfortranarray(v), out),
                 (q, k, v, wide[..., ::2])):
        assert kernel.calls(*args[:3], None, args[3], 0.125) is None
        args[3][...] = np.nan
        kernel(*args[:3], None, args[3], 0.125)
        assert_close(args[3], attention64(q, k, v, None, False, 0.125), dtype="f32",
                     reduced=128)
