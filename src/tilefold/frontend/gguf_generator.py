"""Greedy text generation from a GGUF file with no PyTorch: the model built natively as tilefold IR.

`GGUFGenerator(path)` reads the file (memory-mapped), builds its step function
(`frontend/llama.py`) a tensor at a time, compiles it once with the KV cache donated, and owns
the cache (NumPy arrays written in place). A generation is one call on the prompt's ids, then
one call per token on the same small id and position arrays, so the decode plan replays its
kernels in one native call from its second token on (`compiler.Recording`). Nothing of
PyTorch, transformers or Dynamo is imported: a process holds the weights at their stored
precision, the cache and the compiled kernels.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tilefold.compiler import StepTimes
from tilefold.compiler import compile as tilefold_compile
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.frontend.llama import LlamaConfig, donated, llama_step
from tilefold.frontend.weight_cache import WeightCache
from tilefold.frontend.weight_cache import enabled as weights_cached
from tilefold.quant.gguf import GGUFFile
from tilefold.runtime.buffers import release_pages


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
                 every_position: bool = False, strict: bool | None = None):
        file = GGUFFile(path)
        vocab = file.tensors["token_embd.weight"].shape[0]
        self.config = LlamaConfig.from_gguf(file.architecture, file.metadata, vocab)
        self.max_length = max_length
        self.every_position = every_position
        cache = WeightCache(path) if weights_cached() else None
        module = llama_step(self.config, file, weights_format=weights, max_length=max_length,
                            every_position=every_position,
                            quantize=cache.quantized if cache is not None else None)
        self.graph = tilefold_compile(module, strict=strict, donate=donated(self.config),
                                      in_place=True)
        release_pages(file.data)  # what the build read of the file: faulted in again if used
        shape = self.config.cache_shape(max_length)
        self.caches = [np.zeros(shape, np.float32) for _ in range(2 * self.config.layers)]
        self._token = np.zeros((1, 1), np.int64)  # a decode step's inputs, written in place
        self._start = np.zeros((), np.int64)

    def _logits(self, ids: np.ndarray, start: int) -> np.ndarray:
        self._start[()] = start
        return self.graph(ids, self._start, *self.caches)[0][-1]

    def logits(self, prompt: Sequence[int]) -> np.ndarray:
        """Every position's logits of `prompt` (one prefill; f32 [n, vocab]), for perplexity:
        a generator made with `every_position=True`."""
        if not self.every_position:
            raise UnsupportedError("logits: make the generator with every_position=True")
        if not prompt or len(prompt) > self.max_length:
            raise ShapeError(f"logits: {len(prompt)} tokens need 1..{self.max_length} positions")
        self._start[()] = 0
        return self.graph(np.array([list(prompt)], np.int64), self._start, *self.caches)[0]

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

    def profile(self, prompt: Sequence[int], new_tokens: int) -> StepTimes:
        """Where a decode step's time goes (`CompiledGraph.profiling`: each step timed, a
        native one as the calls a replay makes), over the decode steps of one generation, per
        call in `StepTimes.per_call()`; the prompt's step is not counted."""
        self(prompt, 3)  # the decode step planned and recorded
        result = self._prefill(prompt, new_tokens)
        self.graph.profiling = times = StepTimes()
        try:
            self._decode(result, new_tokens)
        finally:
            self.graph.profiling = None
        return times
