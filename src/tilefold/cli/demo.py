"""`tilefold demo`: a transformer compiled by tilefold, checked against PyTorch and timed.

Default: all-MiniLM-L6-v2 (real weights, offline) embeds a few sentences, prints their cosine
similarities, and compares latency and compile time with PyTorch eager and torch.compile.
`--model bert|gpt2|llama` uses models built from transformers configs with random weights.
"""

from __future__ import annotations

import argparse
from typing import Any

from tilefold.cli import models
from tilefold.cli.benchutil import Bench, Row, Section
from tilefold.cli.inputs import count

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
]
# One model call is a sample (tens of ms or more), so a short pause between contenders suffices.
SETTLE_SECONDS = 0.05


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="compile a transformer with tilefold and compare with PyTorch")
    p.add_argument("--model", choices=models.MODELS, default="minilm")
    p.add_argument("--batch", type=count(1), default=8, help="benchmark batch size (default 8)")
    p.add_argument("--seq", type=count(1), default=128, help="benchmark tokens per sequence")
    p.add_argument("--layers", type=count(1), default=None, help="layers of a config-built model")
    p.add_argument("--rounds", "--runs", type=count(1), default=5,
                   help="timed rounds per contender, interleaved and alone (median)")
    p.add_argument("--no-inductor", action="store_true", help="skip the torch.compile column")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    missing = models.missing_packages(args.model)
    if missing:
        print(f"tilefold demo needs {', '.join(missing)}, which are not installed.")
        print(f"Install the demo extras from the tilefold checkout: {models.INSTALL}")
        return 2
    import torch

    from tilefold.frontend import report

    torch.manual_seed(0)
    model, tokenizer = models.load_model(args.model, args.layers)
    print(f"model: {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M "
          "parameters, fp32)")
    work = models.Workload(args.model, args.batch, args.seq, args.layers,
                           torch.get_num_threads())
    bench = Bench("demo", args.rounds)
    with torch.no_grad():
        if tokenizer is not None:
            _similarity(model, torch.compile(model, backend="tilefold"), tokenizer)
        inputs = models.random_inputs(args.model, args.batch, args.seq)
        found = models.contenders(model, inputs, work, inductor=not args.no_inductor)
        timings = bench.measure({name: c.call for name, c in found.items()},
                                settle=SETTLE_SECONDS, warm_calls=1)
    bench.table(Section(f"batch {args.batch} x {args.seq} tokens, {work.threads} threads",
                        f"{'model':<10}", "ms", [Row(args.model, f"{args.model:<10}", timings)],
                        threads=work.threads))
    print("\n".join(models.format_compile_times(models.compile_rows(found, timings))))
    graphs = report.reports()
    if graphs:
        methods = graphs[-1].methods()
        print("ops by kernel method: " + ", ".join(f"{k} {v}" for k, v in sorted(methods.items())))
    return 0


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
