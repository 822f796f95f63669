"""Outputs larger than the last-level cache are stored around it (non-temporal, where aligned):
chosen per call from the outputs' size, only for stores no later load reads back, and the
results equal float64 NumPy whatever the output buffer's alignment."""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from tests.tolerances import assert_close
from tilefold.codegen.backend import get_backend
from tilefold.codegen.kernel import compile_group, lower_group
from tilefold.codegen.kernel.schedule import final_stores
from tilefold.ir import functional as F
from tilefold.ir import trace
from tilefold.target import host_target


def _softmax(shape):
    return trace(lambda v: F.softmax(v, axis=-1), ("x", "f32", shape))["main"]


def _np_softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_only_the_last_store_of_a_buffer_streams():
    """softmax stores exp(x - max), reloads it to scale by 1/sum and stores again: only the
    second store is final; rms_norm's one store is."""
    kernel, _ = lower_group(_softmax((4, 64)))
    stores = [s for lp in kernel.loops() for s in lp.body if type(s).__name__ == "Store"]
    assert len(stores) == 2
    assert final_stores(kernel) == {id(stores[1])}
    norm = trace(lambda v, w: F.rms_norm(v, w, eps=1e-6), ("x", "f32", (4, 64)),
                 ("w", "f32", (64,)))["main"]
    kernel, _ = lower_group(norm)
    assert len(final_stores(kernel)) == 1


def test_outputs_past_the_cache_stream_and_stay_right():
    """A host whose L3 is 64 KiB: a 256 KiB output streams (vmovnt* in the code, the
    schedule says so), a 16 KiB one does not; both match NumPy, with tilefold's aligned
    outputs and with an `out` buffer 4 bytes off alignment."""
    small = _small_l3()
    group = _softmax((128, 512))
    run = compile_group(group, small)
    rng = np.random.default_rng(7)
    big = rng.standard_normal((128, 512)).astype(np.float32)
    (got,) = run(big)
    assert "streaming stores" in run.kernel_text(big)
    assert_close(got, _np_softmax(big), dtype="f32", reduced=512)
    base = np.empty(big.size + 1, np.float32)
    off = base[1:].reshape(big.shape)  # 4 bytes past NumPy's 16-byte alignment
    run(big, out=[off])
    assert_close(off, _np_softmax(big), dtype="f32", reduced=512)
    little = compile_group(_softmax((8, 512)), small)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    assert "streaming stores" not in little.kernel_text(x)
    assert_close(little(x)[0], _np_softmax(x), dtype="f32", reduced=512)
    kernel, schedule = lower_group(group, small)
    asm = get_backend("llvm").assembly(kernel, dataclasses.replace(schedule,
                                                                  streaming_stores=True), small)
    assert "vmovntps" in asm or "movntps" in asm
    if small.vector_bits >= 256:  # a 16-byte-aligned out= streams in 16-byte pieces
        whole = {256: "ymm", 512: "zmm"}[small.vector_bits]
        assert re.search(rf"vmovntps\s+%{whole}", asm) and re.search(r"vmovntps\s+%xmm", asm)
    half = np.empty(big.size + 8, np.float32).view(np.uint8)
    start = (16 - half.ctypes.data % 32) % 32  # 16 mod 32 bytes: np.empty's alignment
    half = half[start:start + big.nbytes].view(np.float32).reshape(big.shape)
    assert half.ctypes.data % 32 == 16
    run(big, out=[half])
    assert_close(half, _np_softmax(big), dtype="f32", reduced=512)


def _small_l3():
    return dataclasses.replace(host_target(), l3_bytes=64 << 10)


def test_a_streamed_softmax_stashes_exp_in_a_scratch_row():
    """Past the cache the output's one store is the final, streamed one: exp(x - max) waits
    in a per-thread scratch row (`tmp`), not in the output, whose stash store would read
    each line from memory and whose non-temporal store would then evict it. Cached, the
    stash stays in the output (one exp either way)."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal((128, 512)).astype(np.float32)
    streamed = compile_group(_softmax(big.shape), _small_l3())
    assert_close(streamed(big)[0], _np_softmax(big), dtype="f32", reduced=512)
    text = streamed.kernel_text(big)
    assert "streaming stores" in text and text.count("out0[") == 1, text
    assert "tmp stash0: f32 strides [0, 1]" in text
    assert "out0[i0,r1] = stash0[r1] * v0" in text, text  # the final loop computes no exp
    x = big[:8]
    cached = compile_group(_softmax(x.shape), _small_l3())
    assert_close(cached(x)[0], _np_softmax(x), dtype="f32", reduced=512)
    text = cached.kernel_text(x)
    assert text.count("out0[") == 3 and "tmp" not in text  # the stash, its reload, the store


def test_scratch_rows_are_per_thread_and_cover_every_shape():
    """Each thread keeps its own scratch row: rows split over threads, odd widths (masked
    tails), a bf16 output (the stash stays f32), and a softmax over two axes that do not
    merge (a transposed input: the row's first stride is a run-time parameter) all match
    float64 NumPy on random data. With the vector axis outside the row (softmax over the
    first axis of a row-major array) there is no row to keep, and exp is recomputed."""
    rng = np.random.default_rng(11)
    x = (4 * rng.standard_normal((301, 517))).astype(np.float32)
    run = compile_group(_softmax(x.shape), _small_l3())
    assert_close(run(x)[0], _np_softmax(x), dtype="f32", reduced=517)
    assert "tmp stash0" in run.kernel_text(x)

    to_bf16 = trace(lambda v: F.cast(F.softmax(v, axis=-1), "bf16"), ("x", "f32", x.shape))
    run = compile_group(to_bf16["main"], _small_l3())
    assert "tmp stash0" in run.kernel_text(x)
    assert_close(run(x)[0].astype(np.float32), _np_softmax(x), dtype="bf16", reduced=517)

    def two_axes(v):
        e = F.exp(v - F.max(v, axis=(1, 2), keepdims=True))
        return e / F.sum(e, axis=(1, 2), keepdims=True)

    base = rng.standard_normal((40, 37, 64)).astype(np.float32)
    t = base.transpose(0, 2, 1)  # (40, 64, 37), inner axes not mergeable
    run = compile_group(trace(two_axes, ("x", "f32", t.shape))["main"], _small_l3())
    want = np.exp(t.astype(np.float64) - t.max((1, 2), keepdims=True))
    want /= want.sum((1, 2), keepdims=True)
    assert_close(run(t)[0], want, dtype="f32", reduced=64 * 37)
    assert "tmp stash0: f32 strides [0, ?, 1]" in run.kernel_text(t)

    cols = compile_group(trace(lambda v: F.softmax(v, axis=0), ("x", "f32", x.shape))["main"],
                         _small_l3())
    want = np.exp(x.astype(np.float64) - x.max(0))
    assert_close(cols(x)[0], want / want.sum(0), dtype="f32", reduced=301)
    text = cols.kernel_text(x)
    assert "streaming stores" in text and "tmp" not in text, text
