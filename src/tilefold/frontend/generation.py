"""Text generation with a compiled causal LM: prefill, then one compiled decode step per token.

`Generator(model)` holds a Hugging Face causal LM, a static KV cache of `max_length` positions
and the model's forward compiled by a backend (`torch.compile(backend="tilefold")` by default;
"eager" and "inductor" run the same loop, for comparison). A generation is a prefill of the
prompt, then a loop in Python that calls the compiled forward on one token at a time: no
`model.generate` machinery (logits processors, stopping criteria, cache bookkeeping) runs per
token. With tilefold the decode step's graph has the same input tensors every step (the cache,
written in place, and small id/position tensors), so after its second call it replays its
kernels in one native call (`compiler.Recording`), and the loop calls that graph directly
(`dynamo.capture`): Dynamo's guards and AOTAutograd's wrappers run no more per token, as the
generator owns every tensor the graph reads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tilefold.compiler import StepTimes
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.frontend.dynamo import Call, capture
from tilefold.frontend.gguf_generator import Generation

BACKENDS = ("tilefold", "eager", "inductor")
# Decode steps through torch.compile before the step's graph is called directly: the graph is
# compiled and recorded for replay by then (`compiler.Recording` records on the second call).
DIRECT_AFTER = 2


class Generator:
    """Greedy generation of `model` (a `transformers` causal LM in eval mode) on a static cache.

    `backend` is "tilefold" (options passed to the backend, e.g. `{"weights": "int4"}`),
    "eager" or "inductor"; `max_length` bounds prompt + new tokens."""

    def __init__(self, model: Any, *, max_length: int = 512, backend: str = "tilefold",
                 options: dict | None = None):
        from transformers import StaticCache

        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}: use one of {', '.join(BACKENDS)}")
        self.model = model.eval()
        self.backend = backend
        self.max_length = max_length
        self.cache = StaticCache(config=model.config, max_cache_len=max_length)
        _allocate(self.cache, model)  # now: a lazily made cache would change the graph's inputs
        if backend == "eager":
            self.forward = model.forward
        elif backend == "inductor":
            self.forward = torch.compile(model.forward)
        else:
            self.forward = torch.compile(model.forward, backend="tilefold",
                                         options=dict(options or {}))
        self._token = torch.zeros((1, 1), dtype=torch.long)
        self._position = torch.zeros(1, dtype=torch.long)
        self._steps = 0  # decode steps through torch.compile so far
        self._direct: tuple[Call, int] | None = None  # the decode graph, called directly

    def _logits(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.forward(input_ids=ids, past_key_values=self.cache, cache_position=positions,
                           use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def _decode(self, token: int, position: int) -> int:
        """The next token after `token` at `position` (the cache holds everything before)."""
        self._token[0, 0] = token
        self._position[0] = position
        if self._direct is not None:
            call, index = self._direct
            return int(torch.argmax(call.runner(*call.args)[index]))
        self._steps += 1
        if self.backend != "tilefold" or self._steps != DIRECT_AFTER + 1:
            return int(torch.argmax(self._logits(self._token, self._position)))
        with capture() as calls:  # once: a step that cannot be called directly stays compiled
            logits = self._logits(self._token, self._position)
        self._direct = _direct_call(calls, logits)
        return int(torch.argmax(logits))

    def __call__(self, prompt: Sequence[int], new_tokens: int,
                 stop: Sequence[int] = ()) -> Generation:
        """Greedy-decode up to `new_tokens` tokens after `prompt` (stopping after any token in
        `stop`)."""
        prompt = [int(t) for t in prompt]
        if not prompt or len(prompt) + new_tokens > self.max_length:
            raise ShapeError(f"generate: a prompt of {len(prompt)} tokens and {new_tokens} new "
                             f"ones need 1..{self.max_length} positions (max_length)")
        result = Generation(prompt)
        self.cache.reset()
        with torch.no_grad():
            started = time.perf_counter()
            ids = torch.tensor([prompt], dtype=torch.long)
            logits = self._logits(ids, torch.arange(len(prompt)))
            token = int(torch.argmax(logits))
            result.prefill_s = time.perf_counter() - started
            result.tokens.append(token)
            started = time.perf_counter()
            for i in range(new_tokens - 1):
                if token in stop:
                    break
                step = time.perf_counter()
                token = self._decode(token, len(prompt) + i)
                result.tokens.append(token)
                result.step_s.append(time.perf_counter() - step)
            result.decode_s = time.perf_counter() - started
        return result

    def profile(self, prompt: Sequence[int], new_tokens: int) -> StepTimes:
        """Where a decode step's time goes: a generation whose decode graph runs its steps one
        by one, each timed (`CompiledGraph.profiling`; a native step as the calls a replay
        makes); per call, in `StepTimes.per_call()`. The graph is compiled and called directly
        first."""
        if self.backend != "tilefold":
            raise UnsupportedError(f"profile: backend {self.backend!r} has no tilefold graph")
        self(prompt, DIRECT_AFTER + 2)
        call = self._direct[0] if self._direct is not None else None
        runner = getattr(getattr(call, "runner", None), "runner", None)
        graph = getattr(getattr(runner, "run", None), "compiled", None)
        if graph is None:
            raise UnsupportedError("profile: the decode step is not one compiled tilefold graph "
                                   "(a graph break, or the model left to PyTorch)")
        graph.profiling = times = StepTimes()
        try:
            self(prompt, new_tokens)
        finally:
            graph.profiling = None
        return times

    def logits(self, prompt: Sequence[int]) -> np.ndarray:
        """The model's logits at every position of `prompt` (one prefill, float32), for
        perplexity."""
        if not prompt or len(prompt) > self.max_length:
            raise ShapeError(f"logits: {len(prompt)} tokens need 1..{self.max_length} positions")
        self.cache.reset()
        with torch.no_grad():
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            out = self.forward(input_ids=ids, past_key_values=self.cache,
                               cache_position=torch.arange(len(prompt)), use_cache=True)
        return out.logits[0].float().numpy()


def _allocate(cache: Any, model: Any) -> None:
    """Allocate the static cache's tensors (batch 1) before the first forward, so the first and
    later prefills see the same cache and Dynamo traces them once."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype = next(model.parameters()).dtype
    cache.early_initialization(1, kv_heads, head_dim, dtype, torch.device("cpu"))


def _direct_call(calls: list[Call], logits: torch.Tensor) -> tuple[Call, int] | None:
    """The one graph a decode step ran and which of its results holds `logits`; None when the
    step ran several graphs (a graph break) or the logits came from elsewhere."""
    if len(calls) != 1:
        return None
    (call,) = calls
    found = [i for i, out in enumerate(call.outputs) if isinstance(out, torch.Tensor)
             and out.numel() == logits.numel()
             and out.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()]
    if len(found) != 1:
        return None
    runner = getattr(call.runner, "runner", None)
    if runner is not None:
        runner.park = False  # decode steps follow one another: keep the workers spinning
    return call, found[0]
