"""Weight-only matmul (int4/fp4/fp8/int8 codes decoded in registers, or int8 activations with an
integer dot product) against float64 NumPy of the dequantized math, on the host kernels and
every forced fallback: M = 1..9, K and N off the vector width and the group, strided x."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.quant.levels import LEVELS, target_for
from tilefold.codegen.llvm.lowp import weight_only as wo
from tilefold.codegen.llvm.lowp.decode import choose_decoder
from tilefold.codegen.llvm.lowp.wlayout import tile_panels
from tilefold.errors import ShapeError
from tilefold.ir.ops.quant import expand_blocks
from tilefold.quant import QuantizedTensor, dequantize, quantize, quantized_matmul
from tilefold.quant.accuracy import (
    activation_quantization_bound,
    corrected_matmul_bound,
    dequantized_activations,
    matmul_bound,
)
from tilefold.target import named_target

CASES = [("int4", {}), ("int4", {"symmetric": False}), ("fp4", {}), ("fp8", {}),
         ("fp8", {"group_size": 32}), ("int8", {}), ("int8", {"symmetric": False}),
         ("int8", {"group_size": 32}), ("int4", {"group_size": 64})]


def correction(qt: QuantizedTensor) -> np.ndarray:
    """Per element, what the kernels add per unit of sum(x) (0 for symmetric codes): the
    zero point's and offset's share of the weight, stored codes being code + 8 for int4."""
    if qt.zero_point is None and qt.offset is None:
        return np.zeros(qt.shape)
    store = 8 if qt.code.name == "i4" else 0
    zp = 0 if qt.zero_point is None else qt.zero_point.astype(np.float64)
    off = 0 if qt.offset is None else qt.offset.astype(np.float64)
    return expand_blocks(off - (store + zp) * qt.scale.astype(np.float64), qt.shape)


def check(y: np.ndarray, x: np.ndarray, qt: QuantizedTensor) -> None:
    w = dequantize(qt, "f64")
    assert y.shape == (x.shape[0], qt.shape[1]) and y.dtype == np.float32
    err = np.abs(y - x.astype(np.float64) @ w)
    assert (err <= corrected_matmul_bound(x, w, correction(qt))).all(), err.max()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("fmt", "kw"), CASES)
def test_matches_dequantized_reference(rng, level, fmt, kw):
    target = target_for(level)
    for k, n in [(192, 70), (64, 1), (576, 17)]:
        qw = quantize(rng.standard_normal((k, n)).astype(np.float32), fmt, **kw)
        for m in (1, 2, 3, 5, 8, 9):
            x = rng.standard_normal((m, k)).astype(np.float32)
            check(wo.weight_only_matmul(x, qw, target), x, qw)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("k", "group"), [(96, 6), (80, 10), (64, 8), (80, 16), (256, 64)])
@pytest.mark.parametrize(("fmt", "kw"), [("int4", {}), ("int4", {"symmetric": False}),
                                         ("fp4", {}), ("int8", {}), ("fp8", {})])
def test_groups_padded_to_whole_steps(rng, level, k, group, fmt, kw):
    """Groups that are not whole steps (8 k of nibbles, 4 of bytes) are padded with zero codes
    and zero x: odd N, M = 1..9."""
    target = target_for(level)
    qw = quantize(rng.standard_normal((k, 37)).astype(np.float32), fmt, group_size=group, **kw)
    for m in range(1, 10):
        x = rng.standard_normal((m, k)).astype(np.float32)
        check(wo.weight_only_matmul(x, qw, target), x, qw)


@pytest.mark.parametrize("level", LEVELS)
def test_strided_x_and_extreme_codes(rng, level):
    """Codes at -8 and 7 (and between), x spanning magnitudes, read through row strides,
    column strides and reversed rows."""
    target = target_for(level)
    w = rng.choice([-8.0, -1.0, 0.0, 3.0, 7.0], (96, 40)) * rng.uniform(0.5, 2, (1, 40))
    for kw in ({}, {"symmetric": False}):
        qw = quantize(w.astype(np.float32), "int4", **kw)
        x = rng.standard_normal((5, 192)) * 10.0 ** rng.integers(-3, 4, (5, 192))
        x = x.astype(np.float32)
        for view in (x[:, :96], x[:, ::2], x[::-1, 96:], x[1:4, 1::2]):
            check(wo.weight_only_matmul(view, qw, target), view, qw)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("fmt", "kw"), [("int4", {}), ("int4", {"symmetric": False}),
                                         ("fp4", {}), ("int8", {}), ("fp8", {}),
                                         ("int4", {"group_size": 6})])
def test_many_rows_decode_into_gemm_panels(rng, level, fmt, kw):
    """From GEMM_ROWS rows the weight is decoded into the f32 GEMM's panels (N off the panel
    width: a narrow last panel) and the GEMM runs; strided x and a wider y row too."""
    target = target_for(level)
    k, n = 96, 101
    qw = quantize(rng.standard_normal((k, n)).astype(np.float32), fmt, **kw)
    for m in (wo.GEMM_ROWS, 70):
        x = rng.standard_normal((m, 2 * k)).astype(np.float32)
        call = wo.prepare(qw, m, 2 * k, 2, 128, target, 2)
        assert isinstance(call, wo.UnpackedGemm)
        out = np.full((m, 128), 3.0, np.float32)
        call.run(x[:, ::2], out)
        check(out[:, :n], x[:, ::2], qw)
        assert (out[:, n:] == 3.0).all()


@pytest.mark.parametrize("level", LEVELS)
def test_many_rows_in_slices_of_n(rng, monkeypatch, level):
    """A weight whose f32 panels would not fit the cache share is decoded and multiplied a
    slice of N at a time (here forced down to one tile a slice): K off the vector width, N
    off the tile width, strided x, y wider than N; a small weight stays one slice."""
    target = target_for(level)
    k, n = 96, 3 * 64 + 5
    qw = quantize(rng.standard_normal((k, n)).astype(np.float32), "int4", symmetric=False)
    layout = wo.stream_layout(qw, target)
    assert wo.slice_tiles(layout, target) == layout.tiles
    monkeypatch.setattr(wo, "SLICE_FROM", 1 << 62)
    monkeypatch.setattr(wo, "SLICE_L3_SHARE", 1 << 62)
    assert wo.slice_tiles(layout, target) == 1
    for m in (wo.GEMM_ROWS, 37):
        x = rng.standard_normal((m, 2 * k)).astype(np.float32)
        call = wo.prepare(qw, m, 2 * k, 2, 256, target, 2)
        assert len(call.slices) == layout.tiles > 1
        out = np.full((m, 256), 3.0, np.float32)
        call.run(x[:, ::2], out)
        check(out[:, :n], x[:, ::2], qw)
        assert (out[:, n:] == 3.0).all()


@pytest.mark.parametrize("batch", [1, 2])
def test_a_compiled_model_sliced_in_n_with_batch_dims(rng, monkeypatch, batch):
    """Through the compiler, as a model's head runs: x and y of rank 3 ([batch, rows, K]), the
    weight sliced in N (forced): each slice's columns land in y's last axis (a slice taken
    along the rows instead wrote every slice over the first rows)."""
    import tilefold
    from tilefold import dtypes
    from tilefold.ir.builder import Builder
    from tilefold.passes.quantize_weights import quantize_weight

    monkeypatch.setattr(wo, "SLICE_FROM", 1 << 62)
    monkeypatch.setattr(wo, "SLICE_L3_SHARE", 1 << 62)
    m, k, n = 41, 96, 3 * 64 + 5
    codes, scale = quantize_weight(rng.standard_normal((n, k)).astype(np.float32), 1, "int8")
    b = Builder("main")
    x = b.arg("x", "f32", (batch, m, k))
    w = b.op("dequantize", b.constant(codes), b.constant(scale), dtype=dtypes.f32)
    graph = tilefold.compile(b.build(b.op("matmul", x, w, transpose_b=True)), strict=True)
    xs = rng.standard_normal((batch, m, k)).astype(np.float32)
    (y,) = graph(xs)
    assert [d.winner.method for d in graph.decisions(xs.shape)] == ["blocks.gemm"]
    ref = xs.astype(np.float64) @ (codes.astype(np.float64) * scale).T
    bound = corrected_matmul_bound(xs.reshape(-1, k), (codes * scale).T.astype(np.float64), 0)
    assert (np.abs(y - ref).reshape(-1, n) <= bound).all()


@pytest.mark.parametrize("fmt, kw", [("int4", {"symmetric": False}), ("int8", {})])
def test_a_layout_built_a_tile_at_a_time_is_the_same(rng, monkeypatch, fmt, kw):
    """A layout is built a few tiles of codes at a time (a vocabulary head never has
    whole-weight temporaries): one tile a pass gives the bytes of one pass, stored [K, N] or
    [N, K] (axis 1), N off the tile width; its GEMV matches the dequantized reference."""
    from tilefold.runtime import numpy_threads

    target = target_for(LEVELS[-1])
    w = rng.standard_normal((96, 3 * 64 + 5)).astype(np.float32)
    for axis, weight in ((0, w), (1, np.ascontiguousarray(w.T))):
        qt = quantize(weight, fmt, axis=axis, **kw)
        layouts = []
        for piece in (1 << 30, 1):  # one piece, and a tile a piece (on two threads)
            monkeypatch.setattr(numpy_threads, "PIECE_ELEMENTS", piece)
            monkeypatch.setenv("TILEFOLD_NUM_THREADS", "2")
            qt.kernel_layouts.clear()
            layouts.append(wo.stream_layout(qt, target))
        whole, tiled = layouts
        assert whole.tiles > 1 and whole.chunk_bytes == tiled.chunk_bytes
        np.testing.assert_array_equal(whole.data, tiled.data)
    qt = quantize(w, fmt, **kw)
    x = rng.standard_normal((1, 96)).astype(np.float32)
    out = np.empty((1, w.shape[1]), np.float32)
    wo.prepare_layout(wo.stream_layout(qt, target), 1, 96, 1, None, target, 2).run(x, out)
    check(out, x, qt)


def test_writes_the_callers_rows_and_leaves_the_rest(rng):
    """A prepared call writes y[:M, :N] with the planned row stride, nothing past N."""
    qw = quantize(rng.standard_normal((128, 45)).astype(np.float32), "int4")
    x = rng.standard_normal((3, 128)).astype(np.float32)
    out = np.full((3, 64), 7.0, np.float32)
    wo.prepare(qw, 3, 128, ldy=64).run(x, out)
    check(out[:, :45], x, qw)
    assert (out[:, 45:] == 7.0).all()


def test_threads_agree_bitwise(rng):
    qw = quantize(rng.standard_normal((512, 300)).astype(np.float32), "int4")
    x = rng.standard_normal((2, 512)).astype(np.float32)
    one = wo.weight_only_matmul(x, qw, threads=1)
    assert np.array_equal(one, wo.weight_only_matmul(x, qw, threads=2))
    check(one, x, qw)


def test_bf16_activations_and_torch_layout(rng):
    import ml_dtypes

    w = rng.standard_normal((48, 256)).astype(np.float32)  # [N, K] like nn.Linear.weight
    qw = quantize(w, "int4", group_size=64, axis=1)
    x = rng.standard_normal((3, 4, 256)).astype(ml_dtypes.bfloat16)
    y = quantized_matmul(x, qw)
    x32 = x.astype(np.float32).reshape(12, 256)
    wt = dequantize(qw, "f64").T
    assert y.shape == (3, 4, 48)
    assert (np.abs(y.reshape(12, 48) - x32.astype(np.float64) @ wt) <= matmul_bound(x32, wt)).all()


@pytest.mark.parametrize("level", LEVELS)
def test_offsets_and_signed_scales(rng, level):
    """GGUF's blocks: w = q * d + m (Q4_1: unsigned codes, an offset per block) and
    w = (q - 8) * d with d of either sign or 0 (Q4_0)."""
    target = target_for(level)
    k, n = 128, 50
    q = rng.integers(0, 16, (k, n))
    d = rng.uniform(-0.1, 0.1, (k // 32, n)).astype(np.float16).astype(np.float32)
    d[0, :3] = 0.0
    m = rng.uniform(-1, 1, (k // 32, n)).astype(np.float16).astype(np.float32)
    q41 = QuantizedTensor.from_codes("int4", (q - 8).astype("int4"), 0, np.abs(d),
                                     np.full(d.shape, -8).astype("int4"), m)
    q40 = QuantizedTensor.from_codes("int4", (q - 8).astype("int4"), 0, d)
    assert np.array_equal(dequantize(q41, "f64"), q * expand_blocks(np.abs(d), (k, n))
                          + expand_blocks(m, (k, n)))
    for qt in (q41, q40):
        assert wo.stream_layout(qt, target).f16_scales
        for rows in (1, 4, 9):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            check(wo.weight_only_matmul(x, qt, target), x, qt)


def test_decoders_by_level():
    v3, host = target_for("x86-64-v3"), target_for("host")
    assert choose_decoder("i4", v3).method == "offset4"
    assert choose_decoder("fp4e2m1", v3).method == "minifloat"
    wide = host.has("avx512f")
    assert choose_decoder("i4", host).method == ("lut" if wide else "offset4")
    if wide:  # symmetric codes decode to code (the table holds n - 8); corrected ones to n
        assert choose_decoder("i4", host).bias == 8
        assert choose_decoder("i4", host, corrected=True).bias == 0


def test_tiles_balance_the_threads():
    """SmolLM2's 576 and 960 columns (36, 60 panels of 16) split evenly over 2 threads."""
    assert tile_panels(36, 2) == 3 and tile_panels(60, 2) == 3
    assert tile_panels(3072, 2) == 4 and tile_panels(36, 1) == 4


def test_bad_activations_are_refused(rng):
    qw = quantize(rng.standard_normal((64, 8)).astype(np.float32), "int4")
    with pytest.raises(ShapeError, match="f32"):
        wo.weight_only_matmul(np.ones((2, 64)), qw)


def _dot_targets() -> list:
    """Targets whose integer-dot kernel runs here, each instruction the host can run: the host
    itself; with AVX-512, the host without VNNI (16-lane `pmaddubsw`); its AVX2 level (8-lane
    `pmaddubsw`); and, where the host has VNNI with 256-bit EVEX forms, that level plus those."""
    host = target_for("host")
    out = [host] if wo.dot_instruction(16 if host.has("avx512f") else 8, host) else []
    if host.has("avx512vnni", "avx512bw"):
        out.append(dataclasses.replace(host, name=f"{host.name}-novnni",
                                       features=host.features - {"avx512vnni", "avxvnni"}))
    if host.has("avx2"):
        v3 = target_for("x86-64-v3")
        if host.name != v3.name:
            out.append(v3)
        if host.has("avx512vnni", "avx512vl"):
            out.append(dataclasses.replace(v3, name="x86-64-v3-vnni",
                                           features=v3.features | {"avx512vnni", "avx512vl"}))
    return out


DOT_CASES = [("int4", {}), ("int4", {"symmetric": False}), ("int8", {}),
             ("int8", {"group_size": 32}), ("int8", {"symmetric": False}),
             ("int4", {"group_size": 64})]


@pytest.mark.parametrize("target", _dot_targets(), ids=lambda t: f"{t.name}-{t.vector_bits}")
@pytest.mark.parametrize(("fmt", "kw"), DOT_CASES)
def test_integer_dot_matches_its_quantized_activations(rng, target, fmt, kw):
    """The VNNI kernel against float64 NumPy of the same int8 activations (`q8_activations`):
    integer products are exact, so the only error is f32 rounding of the block sums, within the
    f32 kernel bound. Against the float path's exact x @ w the error stays within the
    activations' quantization bound (dx / 2) @ |w| plus that."""
    for k, n in [(192, 70), (64, 1), (576, 33)]:
        qw = quantize(rng.standard_normal((k, n)).astype(np.float32), fmt, **kw)
        w = dequantize(qw, "f64")
        layout = wo.stream_layout(qw, target)
        assert wo.dot_refusal(layout, target) is None
        for m in (1, 2, 4, 5, 9):
            x = rng.standard_normal((m, 2 * k)).astype(np.float32)
            for view in (x[:, :k], x[:, ::2]):
                y = np.empty((m, n), np.float32)
                for threads in (1, 2):
                    wo.WeightOnlyCall(layout, m, view.strides[0] // 4, view.strides[1] // 4, n,
                                      target, threads, dot=True).run(view, y)
                    xq = dequantized_activations(view)
                    bound = corrected_matmul_bound(xq, w, correction(qw))
                    assert (np.abs(y - xq @ w) <= bound).all()
                    exact = view.astype(np.float64) @ w
                    assert (np.abs(y - exact) <= bound + activation_quantization_bound(view, w)
                            + corrected_matmul_bound(view, w, correction(qw))).all()


def test_integer_dot_refusals():
    host = target_for("host")
    rng = np.random.default_rng(0)
    fp4 = quantize(rng.standard_normal((64, 16)).astype(np.float32), "fp4")
    g16 = quantize(rng.standard_normal((64, 16)).astype(np.float32), "int4", group_size=16)
    v2 = target_for("generic")  # no AVX2 pmaddubsw, no VNNI
    assert "no integer dot" in wo.dot_refusal(wo.stream_layout(fp4, v2), v2)
    if host.has("avx2"):
        assert "integer codes" in wo.dot_refusal(wo.stream_layout(fp4, host), host)
        assert "multiple" in wo.dot_refusal(wo.stream_layout(g16, host), host)


def test_integer_dot_instruction_by_features():
    v3, v4 = named_target("x86-64-v3"), named_target("x86-64-v4")
    assert wo.dot_instruction(8, v3) == "maddubs"
    assert wo.dot_instruction(16, v4) == "maddubs"  # AVX512BW without VNNI
    vnni = dataclasses.replace(v4, features=v4.features | {"avx512vnni"})
    assert wo.dot_instruction(16, vnni) == "vnni"
    avxvnni = dataclasses.replace(v3, features=v3.features | {"avxvnni"})
    assert wo.dot_instruction(8, avxvnni) == "vnni"
    assert wo.dot_instruction(8, named_target("generic")) is None
