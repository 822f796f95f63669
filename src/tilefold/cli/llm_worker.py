"""One contender of `tilefold generate` in a process of its own: it loads the model, builds the
contender (tilefold, PyTorch eager or inductor, through `model.generate` or the `Generator`
loop, llama.cpp, or ONNX Runtime GenAI), and answers the parent in JSON lines.

`python -m tilefold.cli.llm_worker SPEC.json`. In "generate" mode it loads, builds, runs one
generation (its time to first token is what a user waits for in this process) and says
`ready`; then each `run` line it reads runs one generation, and `quit` ends it with its peak
RSS. In "logits" mode it writes the logits of the spec's tokens to a .npy file and ends. Its
stdout is the parent's channel: anything else printed goes to stderr. torch is imported only
by the contenders that use it, so llama.cpp's RSS is its own.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import numpy as np

from tilefold.cli import llm_metrics, llm_models
from tilefold.cli.llm_metrics import Weight

# llama.cpp file types by precision: what `llama_model_quantize` writes for --quant.
LLAMA_TYPES = {"F32": "LLAMA_FTYPE_ALL_F32", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
               "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}
SHIPPED = "shipped"  # llama.cpp on the GGUF file as it is


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise OSError(f"/proc/self/status has no {field}")


def rss_bytes() -> int:
    """Resident set size now."""
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM: getrusage's ru_maxrss would carry the
    parent's peak over fork and exec)."""
    return _status_bytes("VmHWM")


def run_record(tokens: list[int], prefill_s: float, decode_s: float) -> dict[str, Any]:
    """One generation as the parent reads it: the new tokens, the seconds to the first (the
    prompt's forward) and of the rest."""
    return {"tokens": tokens, "prefill_s": prefill_s, "decode_s": decode_s}


def sizes(weights_per_token: int, weights_stored: int, kv_shape: tuple[int, int, int],
          context: float, length: int, kv_element: int) -> dict[str, float]:
    """A contender's bytes: read per decoded token (weights; K and V at the mean decode
    `context`) and held (its weights; a KV cache of `length` positions)."""
    layers, kv_heads, head_dim = kv_shape
    return {"weights_per_token": weights_per_token,
            "kv_per_token": llm_metrics.kv_bytes(layers, kv_heads, head_dim, context, kv_element),
            "weights_stored": weights_stored,
            "kv_cache": llm_metrics.kv_bytes(layers, kv_heads, head_dim, length, kv_element)}


# ---- PyTorch contenders --------------------------------------------------------------------------

class TorchContender:
    """A contender over the f32 transformers model; `fmt` is the weights' stored format."""

    fmt = "f32"

    def __init__(self, spec: dict[str, Any], model: Any):
        self.spec, self.model = spec, model

    def sizes(self, context: float, length: int) -> dict[str, float]:
        import torch

        names = {id(t): n for n, t in self.model.named_parameters()}  # tied: the first name
        head = self.model.get_output_embeddings()
        weights = [Weight(f"{m}.{p}" if m else p, tuple(t.shape),
                          "head" if mod is head and p == "weight"
                          else "matmul" if isinstance(mod, torch.nn.Linear) and p == "weight"
                          else "gather" if isinstance(mod, torch.nn.Embedding) else "other",
                          names.get(id(t), ""))
                   for m, mod in self.model.named_modules()
                   for p, t in mod.named_parameters(recurse=False)]
        config = self.model.config.get_text_config()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        shape = (config.num_hidden_layers, kv_heads, head_dim)
        return sizes(llm_metrics.weight_bytes_per_token(weights, self.fmt),
                     llm_metrics.weight_bytes_stored(weights, self.fmt), shape, context, length,
                     llm_metrics.F32)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([list(tokens)])).logits[0].float().numpy()

    def info(self) -> dict[str, Any]:
        return {}


class Loop(TorchContender):
    """tilefold's `Generator`: prefill, then a Python loop over the compiled forward on a
    static cache (backend "tilefold", "eager" or "inductor")."""

    backend = "tilefold"

    def __init__(self, spec: dict[str, Any], model: Any):
        from tilefold.frontend.generation import Generator

        super().__init__(spec, model)
        options = {}
        if self.backend == "tilefold":
            self.fmt = spec["quant"]
            options = {"weights": self.fmt, **({"strict": True} if spec.get("strict") else {})}
            if torchao_quantized(spec, model):  # tilefold runs torchao's own codes
                del options["weights"]
        length = spec["max_length"]
        self.generator = Generator(model, max_length=length, backend=self.backend,
                                   options=options)

    def generate(self, prompt: list[int], new_tokens: int) -> dict[str, Any]:
        got = self.generator(prompt, new_tokens)
        return run_record(got.tokens, got.prefill_s, got.decode_s)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        return self.generator.logits(tokens)

    def info(self) -> dict[str, Any]:
        if self.backend != "tilefold":
            return {}
        from tilefold.frontend import report

        graphs = report.reports()
        methods: dict[str, int] = {}
        for graph in graphs:
            for method, n in graph.methods().items():
                methods[method] = methods.get(method, 0) + n
        return {"graphs": len(graphs), "pytorch_ops": sum(g.fallback_nodes for g in graphs),
                "kernel_methods": methods}


class EagerLoop(Loop):
    backend = "eager"


def torchao_quantized(spec: dict[str, Any], model: Any) -> bool:
    """Quantize `model`'s linear layers with torchao's CPU weight-only scheme at the spec's
    `quant` where the spec asks for it (`torchao`): int8 with a scale per output channel, int4
    in groups of 32 (`IntxWeightOnlyConfig`); whether it did."""
    if not spec.get("torchao"):
        return False
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    quantize_(model, Int8WeightOnlyConfig() if spec["quant"] == "int8" else
              IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    return True


class InductorLoop(Loop):
    backend = "inductor"


class _Clock:
    """A `model.generate` streamer that notes when each new token arrives (the first `put` is
    the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class HFGenerate(TorchContender):
    """`model.generate` as users run it: greedy, the default (growing) cache."""

    cache: str | None = None  # cache_implementation; None: the default

    def generate(self, prompt: list[int], new_tokens: int) -> dict[str, Any]:
        import torch

        ids = torch.tensor([prompt])
        clock = _Clock()
        pad = self.model.generation_config.pad_token_id
        with torch.no_grad():
            start = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      pad_token_id=0 if pad is None else pad, streamer=clock,
                                      cache_implementation=self.cache)
        first, last = clock.times[1], clock.times[-1]
        return run_record(out[0, len(prompt):].tolist(), first - start, last - first)


class HFInductor(HFGenerate):
    """`model.generate` with a static cache and `model.forward` compiled by inductor, as Hugging
    Face recommends for `torch.compile`."""

    cache = "static"

    def __init__(self, spec: dict[str, Any], model: Any):
        import torch

        super().__init__(spec, model)
        if torchao_quantized(spec, model):
            self.fmt = spec["quant"]
        model.forward = torch.compile(model.forward)


# ---- tilefold on a GGUF file, natively ----------------------------------------------------------

def gguf_weights(path: str) -> tuple[list[Weight], tuple[int, int, int]]:
    """A GGUF LLaMA model's weights as a decode step uses them, and its cache's (layers, KV
    heads, head size)."""
    from tilefold.frontend.llama_config import LlamaConfig
    from tilefold.quant.gguf import GGUFFile

    file = GGUFFile(path)
    tied = "output.weight" not in file
    weights = []
    for name, t in file.tensors.items():
        use = "gather" if name == "token_embd.weight" else "head" if name == "output.weight" \
            else "matmul" if len(t.shape) == 2 else "other"
        weights.append(Weight(name, t.shape, use))
        if tied and name == "token_embd.weight":
            weights.append(Weight("output.weight", t.shape, "head", name))
    config = LlamaConfig.from_gguf(file.architecture, file.metadata,
                                   file.tensors["token_embd.weight"].shape[0])
    return weights, (config.layers, config.kv_heads, config.head_dim)


def native_gguf(spec: dict[str, Any]) -> bool:
    """Whether the spec's model is a GGUF file tilefold builds natively (else tilefold runs the
    transformers model through torch.compile)."""
    from tilefold.frontend.llama_config import ARCHITECTURES
    from tilefold.quant.gguf import GGUFFile

    return (bool(spec.get("gguf")) and not spec.get("torchao")
            and GGUFFile(spec["gguf"]).architecture in ARCHITECTURES)


class Native:
    """tilefold's `GGUFGenerator`: the model built natively from its GGUF file (no PyTorch in
    the process), prefill, then one compiled step per token."""

    def __init__(self, spec: dict[str, Any], model: Any = None):
        from tilefold.frontend.gguf_generator import GGUFGenerator

        self.spec, self.fmt = spec, spec["quant"]
        self.generator = GGUFGenerator(spec["gguf"], weights=self.fmt,
                                       max_length=spec["max_length"],
                                       every_position=spec["mode"] == "logits",
                                       strict=True if spec.get("strict") else None)

    def generate(self, prompt: list[int], new_tokens: int) -> dict[str, Any]:
        got = self.generator(prompt, new_tokens)
        return run_record(got.tokens, got.prefill_s, got.decode_s)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        return self.generator.logits(tokens)

    def keep(self) -> None:
        self.generator.keep()

    def sizes(self, context: float, length: int) -> dict[str, float]:
        weights, shape = gguf_weights(self.spec["gguf"])
        return sizes(llm_metrics.weight_bytes_per_token(weights, self.fmt),
                     llm_metrics.weight_bytes_stored(weights, self.fmt), shape, context, length,
                     llm_metrics.F32)

    def info(self) -> dict[str, Any]:
        """The engine, and whether this process ran a step saved by an earlier one (`keep`)
        or compiled it."""
        saved = self.generator.step is not None
        return {"engine": "native GGUF", "step": "saved" if saved else "compiled"}


# ---- llama.cpp -----------------------------------------------------------------------------------

def _all_f32(gguf: str) -> bool:
    """Whether every tensor of the file is F32 already (a config model's weights): no copy."""
    from tilefold.quant.gguf import GGUFFile

    return all(t.kind == "F32" for t in GGUFFile(gguf).tensors.values())


def llama_file(gguf: str, kind: str, folder: str) -> str:
    """`gguf` requantized by llama.cpp to `kind` (a LLAMA_TYPES key) in `folder`, made once;
    `gguf` itself for SHIPPED, and for F32 when it holds F32 tensors only."""
    if kind == SHIPPED or (kind == "F32" and _all_f32(gguf)):
        return gguf
    import llama_cpp

    stem = os.path.splitext(os.path.basename(gguf))[0]
    stat = os.stat(gguf)
    out = os.path.join(folder, f"{stem}-{stat.st_size}-{stat.st_mtime_ns}.{kind}.gguf")
    if os.path.exists(out):
        return out
    os.makedirs(folder, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, LLAMA_TYPES[kind])
    params.allow_requantize = True
    tmp = f"{out}.{os.getpid()}.tmp"
    if llama_cpp.llama_model_quantize(gguf.encode(), tmp.encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize to {kind} failed")
    os.replace(tmp, out)
    return out


def load_llama(spec: dict[str, Any]) -> Any:
    """llama.cpp's model and context for the spec: its GGUF file at the spec's type, the
    spec's threads and context; every position's logits kept in "logits" mode."""
    import llama_cpp

    path = llama_file(spec["gguf"], spec["quant"], spec["llama_dir"])
    threads, context = spec["threads"], spec["max_length"]
    return llama_cpp.Llama(path, n_ctx=context, n_batch=min(context, 512), n_threads=threads,
                           n_threads_batch=threads, logits_all=spec["mode"] == "logits",
                           verbose=False)


class LlamaCpp:
    """llama.cpp (llama-cpp-python) on the GGUF file at the spec's precision: the prompt in one
    batch, then one token at a time, greedy on the last logits."""

    def __init__(self, spec: dict[str, Any], llm: Any):
        import llama_cpp

        self.llm, self.path = llm, llm.model_path
        self.vocab = llm.n_vocab()
        self._logits = llama_cpp.llama_get_logits_ith

    def _next(self) -> int:
        last = np.ctypeslib.as_array(self._logits(self.llm.ctx, -1), shape=(self.vocab,))
        return int(last.argmax())

    def generate(self, prompt: list[int], new_tokens: int) -> dict[str, Any]:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(prompt)
        tokens = [self._next()]
        first = time.perf_counter()
        for _ in range(new_tokens - 1):
            self.llm.eval(tokens[-1:])
            tokens.append(self._next())
        return run_record(tokens, first - start, time.perf_counter() - first)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(list(tokens))
        return np.array(self.llm.scores[:len(tokens)], dtype=np.float32)

    def sizes(self, context: float, length: int) -> dict[str, float]:
        import gguf

        reader = gguf.GGUFReader(self.path)
        tensors = [(t.name, int(t.n_bytes), int(t.shape[-1])) for t in reader.tensors]
        meta = self.llm.metadata
        arch = meta["general.architecture"]
        heads = int(meta[f"{arch}.attention.head_count"])
        head_dim = int(meta.get(f"{arch}.attention.key_length")
                       or int(meta[f"{arch}.embedding_length"]) // heads)
        kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
        shape = (int(meta[f"{arch}.block_count"]), kv_heads, head_dim)
        return sizes(llm_metrics.gguf_bytes_per_token(tensors), sum(n for _, n, _ in tensors),
                     shape, context, length, 2)  # K and V in f16

    def info(self) -> dict[str, Any]:
        return {"file": self.path}


# ---- ONNX Runtime GenAI --------------------------------------------------------------------------

# tilefold's format -> the precision ONNX Runtime GenAI's model builder writes (`-p`).
ORT_GENAI_FOR = {"f32": "fp32", "int4": "int4"}


def ort_genai_model(hf_dir: str, precision: str, folder: str) -> str:
    """The ONNX Runtime GenAI model of the Hugging Face directory `hf_dir` at `precision`, built
    once in `folder` by its model builder (in a child process: it imports torch). A directory
    converted from a GGUF file gets the fields the builder reads: its architecture, and no
    GGUF `quantization_config` (the weights are already f32)."""
    stat = os.stat(os.path.join(hf_dir, "config.json"))
    out = os.path.join(folder, f"ortgenai-{os.path.basename(os.path.normpath(hf_dir))}-"
                               f"{stat.st_mtime_ns}-{precision}")
    if os.path.exists(os.path.join(out, "genai_config.json")):
        return out
    import shutil
    import subprocess
    import tempfile

    os.makedirs(folder, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=folder, prefix=".ortgenai.")
    try:
        source = os.path.join(tmp, "hf")
        os.mkdir(source)
        for name in os.listdir(hf_dir):
            if name != "config.json":
                os.symlink(os.path.join(os.path.abspath(hf_dir), name),
                           os.path.join(source, name))
        with open(os.path.join(hf_dir, "config.json")) as f:
            config = json.load(f)
        config.pop("quantization_config", None)
        config.setdefault("architectures", [f"{config['model_type'].capitalize()}ForCausalLM"])
        with open(os.path.join(source, "config.json"), "w") as f:
            json.dump(config, f)
        built = os.path.join(tmp, "model")
        done = subprocess.run(
            [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", config["model_type"],
             "-i", source, "-o", built, "-p", precision, "-e", "cpu", "-c",
             os.path.join(tmp, "cache")], capture_output=True, text=True, check=False)
        if done.returncode != 0 or not os.path.exists(os.path.join(built, "genai_config.json")):
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"onnxruntime_genai's model builder failed: {tail}")
        os.replace(built, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


class OrtGenAI:
    """ONNX Runtime GenAI on its own model of the f32 weights (built by its model builder at
    the spec's precision): the prompt appended in one call, then greedy tokens one at a time."""

    def __init__(self, spec: dict[str, Any], model: Any):
        import onnxruntime_genai as og

        self.og, self.spec = og, spec
        self.folder = ort_genai_model(spec["path"], ORT_GENAI_FOR[spec["quant"]],
                                      spec["llama_dir"])
        config = og.Config(self.folder)
        config.clear_providers()  # the CPU
        with open(os.path.join(self.folder, "genai_config.json")) as f:
            session = json.load(f)["model"]["decoder"]["session_options"]
        session["intra_op_num_threads"] = spec["threads"]
        config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
        self.model = og.Model(config)

    def generate(self, prompt: list[int], new_tokens: int) -> dict[str, Any]:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.spec["max_length"], do_sample=False)
        start = time.perf_counter()
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(prompt)
        generator.generate_next_token()
        tokens = [int(generator.get_next_tokens()[0])]
        first = time.perf_counter()
        for _ in range(new_tokens - 1):
            if generator.is_done():  # its end-of-text token: the tokens so far are timed
                break
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        return run_record(tokens, first - start, time.perf_counter() - first)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        raise NotImplementedError("ONNX Runtime GenAI is compared on speed, not perplexity")

    def sizes(self, context: float, length: int) -> dict[str, float]:
        """Its weights as the builder stored them (all of them read per token: the tied
        head's codes serve the embedding's gather too), K and V in f32."""
        stored = sum(os.path.getsize(os.path.join(self.folder, n))
                     for n in os.listdir(self.folder) if n.startswith("model.onnx"))
        with open(os.path.join(self.spec["path"], "config.json")) as f:
            config = json.load(f)
        heads = config["num_attention_heads"]
        shape = (config["num_hidden_layers"], config.get("num_key_value_heads", heads),
                 config.get("head_dim") or config["hidden_size"] // heads)
        return sizes(stored, stored, shape, context, length, llm_metrics.F32)

    def info(self) -> dict[str, Any]:
        return {"model": self.folder}


# Contender key -> class; `--compare` names groups of them (`llm_runs.COMPARE`).
CONTENDERS: dict[str, Callable[[dict[str, Any], Any], Any]] = {
    "tilefold": Native, "tilefold-torch": Loop, "hf-eager": HFGenerate, "eager": EagerLoop,
    "hf-inductor": HFInductor, "inductor": InductorLoop, "llamacpp": LlamaCpp,
    "ortgenai": OrtGenAI,
}


# ---- the process ---------------------------------------------------------------------------------

def _send(channel: TextIO, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve(spec: dict[str, Any], channel: TextIO, commands: TextIO) -> None:
    """Build the spec's contender and answer the parent (see the module's docstring)."""
    name = spec["contender"]
    if name == "tilefold" and not native_gguf(spec):
        name = "tilefold-torch"
    if spec.get("activations", "f32") != "f32":  # before any kernel is chosen
        from tilefold.quant.formats import WEIGHT_ACTIVATIONS  # (not the compiler's import)

        os.environ[WEIGHT_ACTIVATIONS] = spec["activations"]
    uses_torch = name not in ("llamacpp", "tilefold", "ortgenai")
    if uses_torch:  # the parent set every other thread knob in the environment
        import torch

        torch.set_num_threads(spec["threads"])
    rss_base = rss_bytes()
    start = time.perf_counter()
    model = (llm_models.load_model(spec["kind"], spec["path"]) if uses_torch
             else load_llama(spec) if name == "llamacpp" else None)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    contender = CONTENDERS[name](spec, model)
    build_s = time.perf_counter() - start
    if spec["mode"] == "logits":
        np.save(spec["logits_out"], contender.logits(spec["tokens"]))
        _send(channel, {"done": True, "seconds": time.perf_counter() - start,
                        "peak_rss": peak_rss_bytes()})
        return
    prompt, new = spec["prompt"], spec["new_tokens"]
    first = contender.generate(prompt, new)
    context = llm_metrics.mean_decode_context(len(prompt), new)
    _send(channel, {"ready": True, "load_s": load_s, "build_s": build_s,
                    "ttft_s": build_s + first["prefill_s"], "first": first,
                    "sizes": contender.sizes(context, spec["max_length"]),
                    "rss_base": rss_base, "info": contender.info()})
    for line in commands:
        if line.strip() == "run":
            _send(channel, contender.generate(prompt, new))
        else:
            break
    peak = {"peak_rss": peak_rss_bytes(), "rss": rss_bytes()}
    keep = getattr(contender, "keep", None)
    if keep is not None:  # what a later process starts from (after this one's figures)
        keep()
    _send(channel, peak)


def main(argv: Sequence[str] | None = None) -> int:
    (path,) = sys.argv[1:] if argv is None else argv
    with open(path) as f:
        spec = json.load(f)
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (libraries, warnings) go to stderr, not into the channel
    try:
        serve(spec, channel, sys.stdin)
    except Exception as exc:  # the parent shows it as this contender's failure
        first = str(exc).strip().splitlines()[:1]
        _send(channel, {"error": f"{type(exc).__name__}: {first[0] if first else ''}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
