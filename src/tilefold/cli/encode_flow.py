"""The sentence-embedding flow of `tilefold bench models --encode`: MiniLM embedding batches of
3-8 sentences of varying length, each batch tokenized and padded to its longest sentence as
sentence-transformers' `encode` does, so the compiled model meets a new shape per batch and
Dynamo traces a second, symbolic graph after the first (its default, automatic dynamic).

One sample is the whole list of batches (tokenizing included, as `encode` pays it); every
contender embeds the same batches, first untimed (compiling every graph and plan), then
interleaved as the other suites time.
"""

from __future__ import annotations

import random
from typing import Any

from tilefold.cli import models
from tilefold.cli.benchutil import Bench, Row, Section

WORDS = ("the", "a", "compiler", "fuses", "kernels", "for", "every", "processor", "it", "meets",
         "while", "tensors", "flow", "through", "graphs", "of", "operations", "quickly", "and",
         "correctly", "on", "servers", "laptops", "phones")


def sentence_batches(count: int, seed: int = 0) -> list[list[str]]:
    """`count` batches of 3-8 sentences of 3-40 words each (seeded)."""
    rng = random.Random(seed)
    return [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
             for _ in range(rng.randint(3, 8))] for _ in range(count)]


def bench_encode(args: Any, bench: Bench, threads: int) -> dict[str, Any]:
    """Time the flow for eager, tilefold and (unless --no-inductor) inductor; a table row."""
    import torch

    from tilefold.frontend import report

    model, tokenizer = models.load_model("minilm", None)
    batches = sentence_batches(args.batches)
    encoded = [tokenizer(b, padding=True, truncation=True, return_tensors="pt") for b in batches]

    def flow(fn: Any) -> Any:
        def run() -> list[Any]:
            out = []
            for b in batches:
                enc = tokenizer(b, padding=True, truncation=True, return_tensors="pt")
                out.append(fn(enc["input_ids"], enc["attention_mask"]))
            return out
        return run

    found = {models.EAGER: flow(model)}
    backends = {models.TILEFOLD: "tilefold"}
    if not args.no_inductor:
        backends[models.INDUCTOR] = "inductor"
    errors: dict[str, float] = {}
    with torch.no_grad():
        want = [model(e["input_ids"], e["attention_mask"]) for e in encoded]
        for name, backend in backends.items():
            torch._dynamo.reset()
            try:
                fn = torch.compile(model, backend=backend)  # Dynamo's default: dynamic after one
                got = flow(fn)()
            except Exception as exc:  # no C++ compiler for inductor: leave it out
                bench.note(f"{name} skipped: {type(exc).__name__}: {exc}")
                continue
            errors[name] = max((g - w).abs().max().item() for g, w in zip(got, want, strict=True))
            found[name] = flow(fn)
        graphs = [(g.graph, g.symbolic_dims) for g in report.reports()]
        timings = bench.measure(found, warm_calls=1)
    shapes = sorted({tuple(e["input_ids"].shape) for e in encoded})
    bench.say(f"\nencode flow: {len(batches)} batches, {len(shapes)} shapes "
              f"(batch x tokens from {shapes[0]} to {shapes[-1]}); tilefold's graphs: {graphs}")
    bench.say("check vs eager, max abs error: " + ", ".join(f"{k} {v:.2e}"
                                                             for k, v in errors.items()))
    bench.table(Section(f"MiniLM encode, batches of 3-8 sentences of varying length, {threads} "
                        "threads", f"{'flow':<10}", "ms",
                        [Row("encode", f"{'encode':<10}", timings)], threads=threads))
    return {"batches": len(batches), "shapes": [list(s) for s in shapes], "graphs": graphs,
            "max_abs_error": errors}
