"""Greedy text generation from a GGUF file with no PyTorch: the model built natively as tilefold IR.

`GGUFGenerator(path)` reads the file (memory-mapped), builds its step function
(`frontend/llama.py`) a tensor at a time, compiles it once with the KV cache donated, and owns
the cache (NumPy arrays written in place). A prompt runs in chunks of the step's sizes
(`STEP_SIZES`: 256, 64, 16, 4 and 1 tokens, the largest that fits first), then one call per
token on the same small id and position arrays, so the decode plan replays its kernels in one
native call from its second token on (`compiler.Recording`). Nothing of PyTorch, transformers
or Dynamo is imported: a process holds the weights at their stored precision, the cache and
the compiled kernels.

The compiled step is saved (`keep()`, after a generation) as an artifact with the cache as its
state (`aot/`, `tilefold.load`): the step at each of `STEP_SIZES`, its kernels linked into one
library and its weights in their packed layouts in one mapped file. A later process with the
same file, weights, length, code and host loads it instead of building and compiling: no IR,
no LLVM, no ml_dtypes in that process, and the very kernels, so the tokens are the same.
`TILEFOLD_SAVED_STEPS=0` turns this off; the saved steps lie under tilefold's cache directory
(`steps/`), named by the model and options and then by the code and host that made them. Saving
a step removes the ones it supersedes (the same model and options, made by other code) and
all but the MAX_SAVED_STEPS most recently used others: each is the size of the weights.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.errors import ShapeError, TilefoldError, UnsupportedError
from tilefold.frontend.llama_config import LlamaConfig
from tilefold.quant.formats import WEIGHT_ACTIVATIONS
from tilefold.quant.gguf import GGUFFile
from tilefold.target.paths import cache_dir
from tilefold.version import code_digest

log = logging.getLogger("tilefold.generate")

STEP_SIZES = (256, 64, 16, 4, 1)  # tokens a step takes at once: a prompt runs in these chunks
MAX_SAVED_STEPS = 4  # saved steps kept beside the newest one, the most recently used first


@dataclass
class Generation:
    """One generation: the new tokens and where the time went (seconds)."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    prefill_s: float = 0.0  # the prompt's forward, up to the first new token
    decode_s: float = 0.0  # every later token
    step_s: list[float] = field(default_factory=list)

    @property
    def prompt_tokens_per_s(self) -> float:
        return len(self.prompt) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        steps = len(self.tokens) - 1
        return steps / self.decode_s if steps > 0 and self.decode_s else 0.0


class GGUFGenerator:
    """Greedy generation of the LLaMA-family model in the GGUF file at `path`; `weights` is how
    its matmul weights are stored ("f32", "int8", "int4"); `max_length` bounds prompt + new
    tokens (the cache's positions)."""

    def __init__(self, path: str | os.PathLike, *, weights: str = "f32", max_length: int = 512,
                 every_position: bool = False, strict: bool | None = None,
                 saved: bool | None = None):
        file = GGUFFile(path)
        vocab = file.tensors["token_embd.weight"].shape[0]
        self.config = LlamaConfig.from_gguf(file.architecture, file.metadata, vocab)
        self.max_length = max_length
        self.every_position = every_position
        self.sizes = [n for n in STEP_SIZES if n <= max_length]
        if saved is None:
            saved = os.environ.get("TILEFOLD_SAVED_STEPS", "1") != "0"
        self.saved_path = _saved_path(path, weights, max_length, every_position) if saved \
            else None
        self.graph: Any = None  # the compiled step, when this process compiled it
        self.step = _load(self.saved_path) if self.saved_path is not None else None
        if self.step is not None:
            self.caches = self.step.state
        else:
            self._compile(file, path, weights, strict)
        self._token = np.zeros((1, 1), np.int64)  # a decode step's inputs, written in place
        self._start = np.zeros((), np.int64)

    def _compile(self, file: GGUFFile, path: str | os.PathLike, weights: str,
                 strict: bool | None) -> None:
        from tilefold.compiler import compile as tilefold_compile
        from tilefold.frontend.llama import donated, llama_step
        from tilefold.frontend.weight_cache import WeightCache
        from tilefold.frontend.weight_cache import enabled as weights_cached
        from tilefold.runtime.buffers import release_pages

        cache = WeightCache(path) if weights_cached() else None
        module = llama_step(self.config, file, weights_format=weights,
                            max_length=self.max_length, every_position=self.every_position,
                            quantize=cache.quantized if cache is not None else None)
        self.graph = tilefold_compile(module, strict=strict, donate=donated(self.config),
                                      in_place=True)
        release_pages(file.data)  # what the build read of the file: faulted in again if used
        shape = self.config.cache_shape(self.max_length)
        self.caches = [np.zeros(shape, np.float32) for _ in range(2 * self.config.layers)]

    def keep(self) -> Path | None:
        """Save the step this process compiled (if it did, and saving is on) for the next
        process; the path, or None. Failing to save is logged, never raised: generation
        goes on without it."""
        if self.graph is None or self.saved_path is None or self.saved_path.exists():
            return None
        from tilefold.aot.export import export_graph

        arrays = [np.zeros((1, 1), np.int64), np.zeros((), np.int64),  # at position 0
                  *(np.zeros_like(c) for c in self.caches)]
        try:
            saved = export_graph(self.graph, arrays, self.saved_path,
                                 dynamic_shapes={"n": self.sizes})
        except (TilefoldError, OSError) as exc:
            log.warning("the compiled step was not saved (%s); the next process compiles "
                        "it again", exc)
            return None
        _prune(saved)
        return saved

    def _run(self, ids: np.ndarray, start: int) -> np.ndarray:
        """The step on `ids` (one of `self.sizes` long) at `start`: its logits."""
        self._start[()] = start
        if self.step is not None:
            return self.step(ids, self._start)[0]
        return self.graph(ids, self._start, *self.caches)[0]

    def _logits(self, ids: np.ndarray, start: int) -> np.ndarray:
        """The last token's logits of `ids` at positions `start`.. (chunks of the sizes)."""
        return self._prefill_chunks(ids, start)[-1][-1]

    def _prefill_chunks(self, ids: np.ndarray, start: int) -> list[np.ndarray]:
        out, at, n = [], 0, ids.shape[1]
        if n in self.sizes:  # as it is: the decode step's same array object replays natively
            return [self._run(ids, start)]
        while at < n:
            size = next(k for k in self.sizes if k <= n - at)
            out.append(self._run(ids[:, at:at + size], start + at))
            at += size
        return out

    def logits(self, prompt: Sequence[int]) -> np.ndarray:
        """Every position's logits of `prompt` (one prefill; f32 [n, vocab]), for perplexity:
        a generator made with `every_position=True`."""
        if not self.every_position:
            raise UnsupportedError("logits: make the generator with every_position=True")
        if not prompt or len(prompt) > self.max_length:
            raise ShapeError(f"logits: {len(prompt)} tokens need 1..{self.max_length} positions")
        return np.concatenate(self._prefill_chunks(np.array([list(prompt)], np.int64), 0))

    def __call__(self, prompt: Sequence[int], new_tokens: int,
                 stop: Sequence[int] = ()) -> Generation:
        """Greedy-decode up to `new_tokens` tokens after `prompt` (stopping after any token in
        `stop`)."""
        result = self._prefill(prompt, new_tokens)
        self._decode(result, new_tokens, stop)
        return result

    def _prefill(self, prompt: Sequence[int], new_tokens: int) -> Generation:
        prompt = [int(t) for t in prompt]
        if not prompt or len(prompt) + new_tokens > self.max_length:
            raise ShapeError(f"generate: a prompt of {len(prompt)} tokens and {new_tokens} new "
                             f"ones need 1..{self.max_length} positions (max_length)")
        result = Generation(prompt)
        started = time.perf_counter()
        result.tokens.append(int(np.argmax(self._logits(np.array([prompt], np.int64), 0))))
        result.prefill_s = time.perf_counter() - started
        return result

    def _decode(self, result: Generation, new_tokens: int, stop: Sequence[int] = ()) -> None:
        started = time.perf_counter()
        token, at = result.tokens[-1], len(result.prompt)
        for i in range(new_tokens - 1):
            if token in stop:
                break
            step = time.perf_counter()
            self._token[0, 0] = token
            token = int(np.argmax(self._logits(self._token, at + i)))
            result.tokens.append(token)
            result.step_s.append(time.perf_counter() - step)
        result.decode_s = time.perf_counter() - started

    def profile(self, prompt: Sequence[int], new_tokens: int) -> Any:
        """Where a decode step's time goes (`CompiledGraph.profiling`: each step timed, a
        native one as the calls a replay makes), over the decode steps of one generation, per
        call in `StepTimes.per_call()` (a generator made with saved=False: the step compiled in
        this process); the prompt's step is not counted."""
        from tilefold.compiler import StepTimes

        if self.graph is None:
            raise UnsupportedError("profile times the compiled step's kernels one by one: make "
                                   "the generator with saved=False")
        self(prompt, 3)  # the decode step planned and recorded
        result = self._prefill(prompt, new_tokens)
        self.graph.profiling = times = StepTimes()
        try:
            self._decode(result, new_tokens)
        finally:
            self.graph.profiling = None
        return times


def _saved_path(path: str | os.PathLike, weights: str, max_length: int,
                every_position: bool) -> Path:
    """Where the step of this file, at these weights and length, made by this code for this
    host, is saved: `<model>-<made>.tfa`, `model` a digest of the file's real path, size and
    modification time and the options (the int8-activation choice among them), `made` one of
    the code's digest and the host's named target and CPU flags."""
    from tilefold.artifact.cpu import host_arch, host_flags

    stat = os.stat(path)
    model = [os.path.realpath(path), stat.st_size, stat.st_mtime_ns, weights, max_length,
             every_position, STEP_SIZES, os.environ.get(WEIGHT_ACTIVATIONS, "")]
    made = [os.environ.get("TILEFOLD_HOST", ""), host_arch(), sorted(host_flags()), code_digest()]
    return cache_dir() / "steps" / f"{_digest(model)}-{_digest(made)}.tfa"


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(" | ".join(map(str, parts)).encode()).hexdigest()[:12]


def _prune(saved: Path) -> None:
    """Remove the saved steps `saved` supersedes (its model's, made by other code or for
    another host) and all but the MAX_SAVED_STEPS most recently used others."""
    import shutil

    model = saved.name.split("-")[0]
    others = sorted((p for p in saved.parent.glob("*.tfa") if p != saved),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    stale = [p for p in others if p.name.split("-")[0] == model]
    kept = [p for p in others if p not in stale]
    for path in stale + kept[MAX_SAVED_STEPS:]:
        shutil.rmtree(path, ignore_errors=True)


def _load(path: Path) -> Any:
    """The saved step at `path`, or None (absent; or refused, which is logged: compiled again
    and saved anew)."""
    if not (path / "manifest.json").exists():
        return None
    from tilefold.artifact import load

    try:
        step = load(path)
    except TilefoldError as exc:
        log.warning("the saved step %s cannot be used (%s); compiling it again", path, exc)
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return None
    os.utime(path)  # used now: `_prune` keeps the most recently used
    return step
