"""bf16/f16 and 8-bit GEMMs: every registered micro-kernel forced and checked (ints bit-exact),
AMX tile edges (on hosts without AMX, its tiles emulated in vector code around the same
driver), K blocking, signed-A compensation and the dequantizing epilogue."""

from __future__ import annotations

import dataclasses
import itertools
import re

import ml_dtypes
import numpy as np
import pytest

from tests.quant.levels import LEVELS, target_for
from tests.tolerances import assert_close
from tilefold.codegen.gemm.blocking import derive_tile_blocking
from tilefold.codegen.llvm.lowp import kernels as lowp_kernels
from tilefold.codegen.llvm.lowp.dotpack import EXACT_K, PackedB, run_native
from tilefold.codegen.llvm.lowp.driver import lowp_gemm_ir
from tilefold.codegen.llvm.lowp.kernels import (
    CHUNK_WORDS,
    DOT_KERNELS,
    describe_lowp,
    select_dot_kernel,
)
from tilefold.quant import matmul_lowp, prepack_lowp
from tilefold.quant.accuracy import matmul_bound
from tilefold.runtime import emit_assembly
from tilefold.runtime.buffers import aligned_empty
from tilefold.target import named_target

# (M, K, N): single elements, edges of every tile and panel, 2+ K blocks of the vector kernels,
# and whole 32 x 32 AMX blocks with a ragged K step.
SHAPES = [(1, 1, 1), (7, 13, 50), (33, 301, 97), (20, 3000, 49), (64, 72, 96)]
FLOATS = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
# The kernel dtype an 8-bit A selects (with B signed).
INT_KINDS = {np.uint8: "u8s8", np.int8: "s8s8"}


def _level_of(kernel, kind: str | None = None) -> str:
    """A target on this host whose selection for `kind` (default: the kernel's dtype) yields
    `kernel` (the host's best, or a fallback)."""
    for level in LEVELS:
        if select_dot_kernel(target_for(level), kind or kernel.dtype) == kernel:
            return level
    pytest.skip(f"{kernel.name} is not reachable on this host")


def _int_cases():
    """(kernel, A dtype): u8s8 kernels run u8 A, and s8 A when not AMX (+128, compensated, on
    byte kernels; sign-extended on s16-code kernels)."""
    for k in DOT_KERNELS:
        if k.dtype == "s8s8" or (k.dtype == "u8s8" and not k.is_amx):
            yield pytest.param(k, np.int8, id=f"{k.name}-int8")
        if k.dtype == "u8s8":
            yield pytest.param(k, np.uint8, id=f"{k.name}-uint8")


@pytest.mark.parametrize("kernel", [k for k in DOT_KERNELS if k.acc_is_float],
                         ids=lambda k: k.name)
def test_float_kernels_within_bound(rng, kernel):
    target = target_for(_level_of(kernel))
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(FLOATS[kernel.dtype])
        b = rng.standard_normal((k, n)).astype(FLOATS[kernel.dtype])
        c = matmul_lowp(a, b, target=target)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert c.dtype == np.float32
        assert (np.abs(c - ref) <= matmul_bound(a, b)).all()


@pytest.mark.parametrize(("kernel", "a_dtype"), list(_int_cases()))
def test_int8_kernels_bit_exact(rng, kernel, a_dtype):
    target = target_for(_level_of(kernel, INT_KINDS[a_dtype]))
    info = np.iinfo(a_dtype)
    for m, k, n in SHAPES:
        a = rng.integers(info.min, info.max + 1, (m, k)).astype(a_dtype)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
        c = matmul_lowp(a, b, target=target)
        assert c.dtype == np.int32
        assert np.array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("level", LEVELS)
def test_empty_products(rng, level):
    """K = 0 is an empty sum (zeros, or the bias when dequantized); M = 0 or N = 0 is empty."""
    target = target_for(level)
    a, b = np.zeros((5, 0), np.int8), np.zeros((0, 7), np.int8)
    assert np.array_equal(matmul_lowp(a, b, target=target), np.zeros((5, 7), np.int32))
    bias = rng.standard_normal(7).astype(np.float32)
    got = matmul_lowp(a, b, col_scale=0.5, bias=bias, target=target)
    assert np.array_equal(got, np.broadcast_to(bias, (5, 7)))
    x = rng.standard_normal((0, 9)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((9, 4)).astype(ml_dtypes.bfloat16)
    assert matmul_lowp(x, w, target=target).shape == (0, 4)
    assert matmul_lowp(w.T[:0], w, target=target).shape == (0, 4)


def test_int8_extremes_do_not_saturate():
    b = np.full((512, 16), -128, np.int8)
    for fill, dtype in ((255, np.uint8), (-128, np.int8)):
        a = np.full((4, 512), fill, dtype)
        for level in LEVELS:
            c = matmul_lowp(a, b, target=target_for(level))
            assert (c == fill * -128 * 512).all()


def test_dequantizing_epilogue(rng):
    a = rng.integers(-128, 128, (9, 200)).astype(np.int8)
    b = rng.integers(-128, 128, (200, 40)).astype(np.int8)
    rs, cs, bias = rng.uniform(0.1, 1, 9), rng.uniform(0.1, 1, 40), rng.standard_normal(40)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    for level in LEVELS:
        c = matmul_lowp(a, b, row_scale=rs, col_scale=cs, bias=bias, target=target_for(level))
        ref = exact * rs[:, None].astype(np.float32) * cs.astype(np.float32) + bias
        assert c.dtype == np.float32
        assert np.allclose(c, ref, rtol=3e-7 * 4, atol=1e-5)


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_sums_past_the_int32_range(rng, a_dtype):
    """K past EXACT_K runs in exact K slices: the int32 result wraps as NumPy's int32 matmul
    does, and the dequantized one (summed in f32 over the slices) does not wrap at all."""
    k = 2 * EXACT_K + 37
    info = np.iinfo(a_dtype)
    a = np.full((5, k), info.max if a_dtype == np.uint8 else info.min, a_dtype)
    a[1:] = rng.choice(np.array([info.min, info.max], a_dtype), (4, k))
    b = np.full((k, 33), -128, np.int8)
    b[:, 1:] = rng.integers(-128, 128, (k, 32))
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert np.abs(exact).max() >= 2**31  # the first row and column leave int32
    rs, cs = rng.uniform(0.5, 1, 5), rng.uniform(0.5, 1, 33)
    bias = rng.standard_normal(33)
    slices = sum(np.abs(a[:, s].astype(np.int64) @ b[s].astype(np.int64))
                 for s in (slice(0, EXACT_K), slice(EXACT_K, 2 * EXACT_K), slice(2 * EXACT_K, k)))
    scale = slices * rs[:, None] * cs
    for level in LEVELS:
        target = target_for(level)
        for rhs, threads in itertools.product((b, prepack_lowp(b, a_dtype, target=target)), (1, 2)):
            c = matmul_lowp(a, rhs, target=target, threads=threads)
            assert np.array_equal(c, exact.astype(np.int32)), (level, threads)
            d = matmul_lowp(a, rhs, row_scale=rs, col_scale=cs, bias=bias, target=target,
                            threads=threads)
            assert_close(d, exact * rs[:, None].astype(np.float32) * cs.astype(np.float32)
                         + bias.astype(np.float32), dtype="f32", reduced=3, scale=scale)


def test_prepacked_b_and_batched_a(rng):
    b = rng.standard_normal((64, 30)).astype(ml_dtypes.bfloat16)
    packed = prepack_lowp(b, "bf16")
    a = rng.standard_normal((2, 3, 64)).astype(ml_dtypes.bfloat16)
    c = matmul_lowp(a, packed)
    assert c.shape == (2, 3, 30)
    assert np.array_equal(c, matmul_lowp(a, b))


def test_host_picks_the_special_instructions():
    host, no_amx = target_for("host"), target_for("no-amx")
    if host.has("amx-tile", "amx-bf16", "amx-int8"):
        assert [select_dot_kernel(host, d).dot for d in ("bf16", "u8s8", "s8s8")] == [
            "tdpbf16ps", "tdpbusd", "tdpbssd"]
    if no_amx.has("avx512bf16"):
        assert select_dot_kernel(no_amx, "bf16").dot == "dpbf16"
    if no_amx.has("avx512vnni"):
        assert select_dot_kernel(no_amx, "s8s8").dot == "dpbusd"
    assert select_dot_kernel(target_for("x86-64-v3"), "u8s8").dot == "pmaddwd"


def test_every_kernel_the_host_can_run_is_reached():
    reached = {select_dot_kernel(target_for(level), k.dtype) for level in LEVELS
               for k in DOT_KERNELS}
    host = target_for("host")
    assert {k for k in DOT_KERNELS if host.has(*k.features)} <= reached


def _amx_row(kind: str):
    return next(k for k in DOT_KERNELS if k.is_amx and k.dtype == kind)


def _tile_gemm(host, emulate: bool):
    """C = A @ B on the AMX rows: through `matmul_lowp` on a host with usable AMX, else the
    same driver with the tiles emulated (`run_native(..., emulate=True)`)."""
    if not emulate:
        def run(a, b, threads):
            return matmul_lowp(a, b, target=host, threads=threads)

        def pack(b, a_dtype):
            return prepack_lowp(b, a_dtype, target=host)
        return run, pack
    rows = {np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype(np.uint8): "u8s8",
            np.dtype(np.int8): "s8s8"}

    def run(a, b, threads):
        return run_native(a, b, _amx_row(rows[a.dtype]), host, None, threads, emulate=True)

    def pack(b, a_dtype):
        return PackedB(b, _amx_row(rows[np.dtype(a_dtype)]), host)
    return run, pack


@pytest.mark.parametrize(("threads", "l2_bytes"), [(1, None), (2, None), (2, 64 << 10)])
def test_amx_blocks_threads_and_prepacking(rng, threads, l2_bytes):
    """Edges in M, N and K around the 32 x 32 blocks and 16-word K steps, raw and prepacked B,
    on one and two threads; K = 1100 spans several K blocks (partial sums kept), a 64 KiB
    L2 makes MC = 16 (several row blocks), and one panel on two threads leaves the second
    thread only the first's units to take. Without AMX the tiles are emulated (smaller K)."""
    host = target_for("host")
    emulate = not select_dot_kernel(host, "bf16").is_amx
    if l2_bytes is not None:
        host = dataclasses.replace(host, l2_bytes=l2_bytes)
    run, pack = _tile_gemm(host, emulate)
    shapes = [(31, 33, 65), (96, 257, 64), (130, 1100, 47), (100, 70, 20)]
    for m, k, n in [*shapes[:2], (40, 300, 47)] if emulate else shapes:
        a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
        c = run(a, b, threads)
        assert np.array_equal(c, run(a, pack(b, a.dtype), threads))
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert (np.abs(c - ref) <= matmul_bound(a, b)).all()
        for a_dtype in (np.uint8, np.int8):
            info = np.iinfo(a_dtype)
            ai = rng.integers(info.min, info.max + 1, (m, k)).astype(a_dtype)
            bi = rng.integers(-128, 128, (k, n)).astype(np.int8)
            exact = ai.astype(np.int64) @ bi.astype(np.int64)
            assert np.array_equal(run(ai, bi, threads), exact)
            assert np.array_equal(run(ai, pack(bi, a_dtype), threads), exact)


def test_emulated_amx_dequantizes_and_handles_empty_sums(rng):
    """The dequantizing epilogue after the tile blocks, and K = 0 (no block runs: C is the
    bias), on the emulated tiles."""
    host = target_for("host")
    row = _amx_row("s8s8")
    a = rng.integers(-128, 128, (20, 90)).astype(np.int8)
    b = rng.integers(-128, 128, (90, 40)).astype(np.int8)
    rs, cs = rng.uniform(0.1, 1, 20).astype(np.float32), rng.uniform(0.1, 1, 40).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    c = run_native(a, b, row, host, (rs, cs, bias), 2, emulate=True)
    ref = (a.astype(np.int64) @ b.astype(np.int64)) * rs[:, None] * cs + bias
    assert c.dtype == np.float32 and np.allclose(c, ref, rtol=3e-7 * 4, atol=1e-5)
    empty = run_native(a[:, :0], b[:0], row, host, (rs, cs, bias), 1, emulate=True)
    assert np.array_equal(empty, np.broadcast_to(bias, (20, 40)))


def test_amx_refused_falls_back_and_says_why(rng, monkeypatch):
    """When the OS refuses AMX tile data the vector kernels are chosen, and describe_lowp
    names the refusal."""
    monkeypatch.setattr(lowp_kernels, "enable_amx", lambda: False)
    host = target_for("host")
    assert not any(select_dot_kernel(host, d).is_amx for d in ("bf16", "u8s8", "s8s8"))
    if host.has("amx-tile"):
        assert "refused this process AMX" in "\n".join(describe_lowp(host))
    a = rng.integers(-128, 128, (5, 70)).astype(np.int8)
    b = rng.integers(-128, 128, (70, 9)).astype(np.int8)
    assert np.array_equal(matmul_lowp(a, b), a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("kernel", [k for k in DOT_KERNELS if k.is_amx], ids=lambda k: k.name)
def test_amx_inner_loop_is_tile_loads_and_dots(kernel):
    """The K loop is 3 tile loads + 2 dots of the kernel's instruction, nothing on the stack;
    the module touches five tiles (two accumulators, one A, two B)."""
    asm = emit_assembly(lowp_gemm_ir(kernel, named_target("sapphirerapids")),
                        named_target("sapphirerapids")).splitlines()
    first = next(i for i, line in enumerate(asm) if kernel.dot in line)
    start = max(i for i in range(first) if asm[i].startswith(".LBB"))
    end = next(i for i in range(first, len(asm)) if asm[i].startswith(".LBB"))
    loop = [line.split()[0] for line in asm[start + 1:end] if line.startswith("\t")]
    assert loop.count(kernel.dot) == 2 and loop.count("tileloadd") == 3
    assert len(set(re.findall(r"%tmm\d", "\n".join(asm)))) == 5
    assert not any("rsp" in line for line in asm[start:end])
    assert "ldtilecfg" in "\n".join(asm) and "tilerelease" in "\n".join(asm)


def _amx_chips():
    """The AMX chips' own cache geometry (48 KiB L1d), and the host's when it has AMX tiles."""
    chips = [named_target("sapphirerapids"), named_target("emeraldrapids")]
    host = target_for("host")
    return [*chips, host] if host.has("amx-tile") else chips


@pytest.mark.parametrize("kgp", [16, 192, 272, 512, 1024, 4096])
def test_amx_blocking_fits_the_caches(kgp):
    """The KC x 32 B slice fits in L1 and MC rows of packed A over all of K in a quarter of L2
    (or one 16-row block when even that is too much); blocks are whole tiles and balanced."""
    for host, m_share in itertools.product(_amx_chips(), (32, 100, 1024, 4096)):
        amx = next(k for k in DOT_KERNELS if k.is_amx)
        blk = derive_tile_blocking(host, amx, kgp, m_share, CHUNK_WORDS)
        mc, kc = blk.mc, blk.kc
        assert kc % CHUNK_WORDS == 0 and kc <= kgp and kc * amx.nr * 4 <= host.l1d_bytes
        blocks = -(-kgp // kc)
        assert blocks == 1 or kgp - (blocks - 1) * kc > kc // 2  # no sliver of a K block
        assert mc % amx.mr == 0 and mc <= -(-m_share // amx.mr) * amx.mr
        assert mc == amx.mr or mc * kgp * 4 <= host.l2_bytes // 4


def test_prepacked_panels_are_64_byte_aligned(rng):
    """Tile rows are 64 bytes and vector loads read whole lines: prepacked panels start on a
    cache line (the host's row: AMX or not)."""
    host = target_for("host")
    for _ in range(4):
        b = rng.integers(-128, 128, (rng.integers(1, 300), rng.integers(1, 100))).astype(np.int8)
        assert prepack_lowp(b, np.uint8, target=host).panels.ctypes.data % 64 == 0
    assert aligned_empty((3, 5), np.int32).ctypes.data % 64 == 0


def test_plan_is_reused_with_fresh_scales(rng):
    """A shape's run plan is cached; the dequantizing epilogue still reads each call's vectors
    (on the host's u8s8 row)."""
    host = target_for("host")
    a = rng.integers(0, 256, (40, 96)).astype(np.uint8)
    b = rng.integers(-128, 128, (96, 50)).astype(np.int8)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    for _ in range(3):
        rs, cs, bias = rng.uniform(0.1, 1, 40), rng.uniform(0.1, 1, 50), rng.standard_normal(50)
        c = matmul_lowp(a, b, row_scale=rs, col_scale=cs, bias=bias, target=host)
        ref = exact * rs[:, None].astype(np.float32) * cs.astype(np.float32) + bias
        assert np.allclose(c, ref, rtol=3e-7 * 4, atol=1e-5)
        assert np.array_equal(matmul_lowp(a, b, target=host), exact)


def test_amx_strided_operands(rng):
    """Raw B and A whose elements are not adjacent in a row (column slices), and B with
    broadcast (zero-stride) rows, are read correctly."""
    host = target_for("host")
    a = rng.integers(0, 256, (40, 140)).astype(np.uint8)[:, ::2]
    b = rng.integers(-128, 128, (70, 66)).astype(np.int8)[:, ::2]
    row = np.broadcast_to(rng.integers(-128, 128, (1, 33)).astype(np.int8), (70, 33))
    for bb in (b, row):
        exact = a.astype(np.int64) @ bb.astype(np.int64)
        assert np.array_equal(matmul_lowp(a, bb, target=host), exact)
