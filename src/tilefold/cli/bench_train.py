"""Training steps: tilefold vs PyTorch eager and Inductor, forward + backward + optimizer.

Workloads: `minilm`, a MiniLM-shaped (all-MiniLM-L6-v2's config: 6 layers, 384 wide, 12
heads) BERT encoder fine-tuned as a 2-class sentence classifier (mean pooling, a linear head,
cross-entropy); `gpt2`, a GPT-2 config language model's loss (`--layers` deep, 2 by default:
GPT-2 small's width, vocabulary and head, fewer blocks). Random weights, random tokens,
batch x seq (8 x 128 by default), dropout off unless `--dropout P` (then in training mode:
every contender draws its own masks). A step is
`zero_grad`, the compiled model's loss, `backward` and an AdamW step, which each compiling
contender compiles too (`torch.compile(opt.step)` with its backend: tilefold's multi-tensor
kernel, Inductor's; `--eager-optimizer` runs it in PyTorch for every contender); each
contender trains its own copy of the model.

Step times are interleaved medians after warm-up steps, then each contender alone
(`Bench.measure`). Peak RSS is each contender's own process (`VmHWM`): a child builds the same
model, compiles it and runs `--rss-steps` steps. The same child times its first step (compile
+ step), the figure to compare: in the bench's own process the contender that runs first pays
for PyTorch's once-per-process work (Dynamo's and AOTAutograd's lazy imports and tables,
~2-3.5 s of MiniLM's warm first step on the shared Zen 3 host), which the others then skip.
tilefold's first-step loss is checked against eager's (without dropout). Run it under
`flock /tmp/tilefold-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tilefold.cli.benchutil import Bench, Row, Section, Suite
from tilefold.errors import TilefoldError

WORKLOADS = ("minilm", "gpt2")
CONTENDERS = {"tilefold": "tilefold", "eager": None, "inductor": "inductor"}
CHILD_TIMEOUT_S = 900


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(WORKLOADS),
                        help=f"comma-separated, from {','.join(WORKLOADS)} (default: all)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--layers", type=int, default=2,
                        help="GPT-2's blocks (default 2; MiniLM keeps its 6)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    parser.add_argument("--eager-optimizer", action="store_true",
                        help="run the AdamW step in PyTorch for every contender")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="dropout probability, in training mode (default 0: off)")
    parser.add_argument("--rss-steps", type=int, default=3,
                        help="steps each peak-RSS child runs (0: no RSS children; default 3)")


def build(name: str, batch: int, seq: int, layers: int, dropout: float = 0.0
          ) -> tuple[Any, tuple]:
    """(a module returning the step's scalar loss, its inputs), seeded: every call alike;
    with `dropout`, its dropout layers at that probability and in training mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "minilm":
        config = minilm_config(hidden_dropout_prob=dropout,
                               attention_probs_dropout_prob=dropout)
        model = minilm_classifier(config).train(dropout > 0)  # weights first, then inputs
        ids = torch.randint(0, config.vocab_size, (batch, seq))
        inputs = (ids, torch.ones(batch, seq, dtype=torch.long), torch.randint(0, 2, (batch,)))
        return model, inputs
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=layers, resid_pdrop=dropout,
                                         embd_pdrop=dropout, attn_pdrop=dropout,
                                         use_cache=False)
        lm = transformers.GPT2LMHeadModel(config)

        class LMLoss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lm = lm

            def forward(self, ids):
                return self.lm(input_ids=ids, labels=ids).loss

        return LMLoss().train(dropout > 0), (torch.randint(0, config.vocab_size, (batch, seq)),)
    raise TilefoldError(f"unknown model {name!r}; choose from {','.join(WORKLOADS)}")


def minilm_config(**overrides: Any) -> Any:
    """MiniLM's shape (all-MiniLM-L6-v2: 6 layers, 384 wide, 12 heads) as a transformers
    `BertConfig`, dropout off; `overrides` (a smaller `num_hidden_layers`, ...) replace it."""
    import transformers

    shape = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
             "intermediate_size": 1536, "hidden_dropout_prob": 0.0,
             "attention_probs_dropout_prob": 0.0}
    return transformers.BertConfig(**(shape | overrides))


def minilm_classifier(config: Any) -> Any:
    """A BERT encoder (random weights) under a 2-class head on its masked mean: a module
    `(ids, mask, labels) -> cross-entropy loss`, in eval mode (dropout off; gradients flow as
    in training). The fine-tuning step `bench train` times and the dp training test runs."""
    import torch
    import torch.nn.functional as F
    import transformers

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = transformers.BertModel(config, add_pooling_layer=False)
            self.head = torch.nn.Linear(config.hidden_size, 2)

        def forward(self, ids, mask, labels):
            hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            weight = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weight).sum(1) / weight.sum(1)
            return F.cross_entropy(self.head(pooled), labels)

    return Classifier().eval()


def stepper(name: str, backend: str | None, batch: int, seq: int, layers: int,
            eager_optimizer: bool = False, dropout: float = 0.0
            ) -> tuple[Callable[[], float], float]:
    """A training step of a fresh model under `backend` (None: eager), returning its loss,
    and the seconds of its first step (compiling, for a backend); the optimizer's step is
    compiled by the backend too unless `eager_optimizer`."""
    import torch

    model, inputs = build(name, batch, seq, layers, dropout)
    run = model if backend is None else torch.compile(model, backend=backend, dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    update = opt.step if backend is None or eager_optimizer else torch.compile(
        opt.step, backend=backend)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = run(*inputs)
        loss.backward()
        update()
        return float(loss.detach())

    started = time.perf_counter()
    step.first_loss = step()  # type: ignore[attr-defined]
    return step, time.perf_counter() - started


def _models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise TilefoldError(f"unknown model(s) {', '.join(unknown) or repr(text)}; "
                            f"choose from {','.join(WORKLOADS)}")
    return names


def run(args: argparse.Namespace, bench: Bench) -> int:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"tilefold bench train needs torch and transformers: {exc}")
        return 2
    names = _models(args.models)
    (threads,) = args.thread_counts
    os.environ["TILEFOLD_NUM_THREADS"] = str(threads)  # before tilefold's thread pool starts

    torch.set_num_threads(threads)
    bench.note(f"training step (forward, backward, AdamW "
               f"{'in PyTorch' if args.eager_optimizer else 'compiled by each backend'}), "
               f"batch {args.batch} x {args.seq} "
               f"tokens, {threads} threads, medians of {args.rounds} rounds; fp32, "
               f"{f'dropout {args.dropout} (training mode)' if args.dropout else 'dropout off'}")
    section = Section(f"step time, batch {args.batch} x {args.seq}, {threads} threads",
                      f"{'model':<10}", "ms", threads=threads)
    results: dict[str, Any] = {}
    for name in names:
        row, results[name] = _bench_workload(name, args, bench, threads)
        section.rows.append(row)
    bench.table(section)
    bench.extra.update(batch=args.batch, seq=args.seq, layers=args.layers, threads=threads,
                       torch=torch.__version__, models=results)
    return 0


def _bench_workload(name: str, args: argparse.Namespace, bench: Bench, threads: int
                    ) -> tuple[Row, dict[str, Any]]:
    from tilefold.frontend import report

    steps: dict[str, Callable[[], float]] = {}
    first: dict[str, float] = {}
    losses: dict[str, float] = {}
    skipped: dict[str, str] = {}
    before = len(report.reports())  # this workload's graphs only
    for contender, backend in CONTENDERS.items():
        if contender == "inductor" and args.no_inductor:
            continue
        try:
            step, first[contender] = stepper(name, backend, args.batch, args.seq, args.layers,
                                             args.eager_optimizer, args.dropout)
        except Exception as exc:  # an inductor without a C++ compiler: leave it out
            if contender != "inductor":
                raise
            skipped[contender] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            bench.note(f"{contender} skipped for {name}: {skipped[contender]}")
            continue
        steps[contender], losses[contender] = step, step.first_loss  # type: ignore[attr-defined]
    graphs = report.reports()[before:]
    native = sum(g.mode == "tilefold" for g in graphs)
    timings = bench.measure(steps, warm_calls=1)
    children = {c: _child(name, c, args, threads) for c in steps} if args.rss_steps else {}
    rss = {c: run.get("peak_rss_bytes") for c, run in children.items()}
    alone = {c: run["first_step_s"] for c, run in children.items() if "first_step_s" in run}
    model, _ = build(name, args.batch, args.seq, args.layers)
    params = sum(p.numel() for p in model.parameters())
    bench.say(f"\n{name}: {params / 1e6:.1f} M parameters, {len(graphs)} tilefold graph(s), "
              f"{native} native")
    bench.say("first step s (compile + step), in turn in this process: " + ", ".join(
        f"{c} {s:.1f}" for c, s in first.items()))
    if alone:
        bench.say("first step s, each in its own process: " + ", ".join(
            f"{c} {s:.1f}" for c, s in alone.items()))
    bench.say("first-step loss: " + ", ".join(f"{c} {v:.6f}" for c, v in losses.items()))
    if rss:
        bench.say("peak RSS MB (own process): " + ", ".join(
            f"{c} {v / 1e6:.0f}" if v else f"{c} -" for c, v in rss.items()))
    error = abs(losses["tilefold"] - losses["eager"])
    if not args.dropout and error > 1e-3 * max(1.0, abs(losses["eager"])):  # masks differ
        raise TilefoldError(f"{name}: tilefold's first-step loss {losses['tilefold']} differs "
                            f"from eager's {losses['eager']}")
    row = Row(name, f"{name:<10}", timings, info={"params": params})
    return row, {"params": params, "first_step_s": first, "first_step_own_process_s": alone,
                 "first_loss": losses,
                 "peak_rss_bytes": rss, "skipped": skipped,
                 "graphs": [g.format() for g in graphs]}


def _child(name: str, contender: str, args: argparse.Namespace, threads: int
           ) -> dict[str, float]:
    """Peak resident bytes (`peak_rss_bytes`) and first step's seconds (`first_step_s`) of a
    process that builds, compiles and trains `rss_steps` steps; {} where it failed."""
    command = [sys.executable, "-m", "tilefold.cli.bench_train", name, contender,
               str(args.batch), str(args.seq), str(args.layers), str(threads),
               str(args.rss_steps), str(int(args.eager_optimizer)), str(args.dropout)]
    env = {**os.environ, "TILEFOLD_NUM_THREADS": str(threads)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=True,
                              timeout=CHILD_TIMEOUT_S, env=env)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"peak RSS of {contender} on {name} not measured: {exc}", file=sys.stderr)
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str]) -> None:
    """The peak-RSS child: NAME CONTENDER BATCH SEQ LAYERS THREADS STEPS EAGER_OPTIMIZER
    DROPOUT."""
    name, contender, batch, seq, layers, threads, count, eager_optimizer, dropout = argv
    import torch

    torch.set_num_threads(int(threads))
    step, first = stepper(name, CONTENDERS[contender], int(batch), int(seq), int(layers),
                          eager_optimizer == "1", float(dropout))
    for _ in range(int(count) - 1):
        step()
    print(json.dumps({"peak_rss_bytes": _peak_rss(), "first_step_s": first}))


SUITE = Suite("train", __doc__, add_arguments, run, rounds=3, threads="all")

if __name__ == "__main__":
    main(sys.argv[1:])
