"""`tilefold tune`: measure the kernel candidates of an IR file or a model now, keep the winners
in the tuning database, and show where measurement overruled the cost model; `--gemm` refines
the GEMM's blocking, `--comm` fits the collective model. Tune on a quiet host: a busy one makes
poor picks."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
from collections.abc import Iterator

from tilefold.cli import models
from tilefold.cli.explain import DEFAULT_SIZE, compile_file, format_ms
from tilefold.cli.inputs import count
from tilefold.errors import TilefoldError
from tilefold.strategy import Decision
from tilefold.strategy.autotune import DEFAULT_BUDGET_S
from tilefold.strategy.tuning_db import TuningDB


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", description=__doc__,
                       help="measure kernel candidates now and keep the winners")
    p.add_argument("file", nargs="?", help="an IR file (.tfir)")
    p.add_argument("--gemm", action="store_true",
                   help="refine this machine's GEMM cache blocking (MC/KC/NC) and GEMV "
                   "prefetch distance and panel around the model; `tilefold info` then shows them")
    p.add_argument("--comm", action="store_true",
                   help="time all_reduce on local torch.distributed ranks and fit the alpha-beta "
                   "collective model the distributed cost model uses")
    p.add_argument("--ranks", type=count(2), default=2,
                   help="--comm: local ranks (default 2; more than the cores oversubscribes)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="--comm: torch.distributed backend (default gloo)")
    p.add_argument("--threads", type=count(1), default=None,
                   help="--gemm: threads per product (default: all this process may use)")
    p.add_argument("--model", choices=models.MODELS, help="tune a model as `tilefold demo` runs it")
    p.add_argument("--function", default="main", help="function of FILE (default: main)")
    p.add_argument("--bind", action="append", default=[], metavar="DIM=SIZE",
                   help="size of a symbolic dim of FILE, e.g. --bind batch=8 "
                   f"(default {DEFAULT_SIZE})")
    p.add_argument("--batch", type=count(1), default=8,
                   help="model: sequences per call (default 8)")
    p.add_argument("--seq", type=count(1), default=128,
                   help="model: tokens per sequence (default 128)")
    p.add_argument("--layers", type=count(1), default=None,
                   help="model: keep only this many layers (default: all)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                   help=f"seconds of measurement per compile (default {DEFAULT_BUDGET_S:g})")
    p.add_argument("--again", action="store_true",
                   help="measure groups the tuning database already holds, replacing them")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if not 0 < args.budget < math.inf:
        raise TilefoldError(f"--budget must be a positive number of seconds, "
                            f"not {args.budget}")
    if args.gemm or args.comm:
        flag = "--gemm" if args.gemm else "--comm"
        if args.file is not None or args.model is not None or (args.gemm and args.comm):
            raise TilefoldError(f"{flag} tunes alone: give no IR file, --model or other flag")
        return _tune_gemm(args) if args.gemm else _tune_comm(args)
    if (args.file is None) == (args.model is None):
        raise TilefoldError("give an IR file, --model NAME, --gemm or --comm (one of them)")
    settings = {"TILEFOLD_TUNE": repr(args.budget), "TILEFOLD_RETUNE": "1" if args.again else "0"}
    with _environment(settings):
        decisions = _model_decisions(args) if args.model else _file_decisions(args)
    print(format_decisions(decisions))
    print(f"tuning database: {TuningDB().path}")
    return 0


def _tune_gemm(args: argparse.Namespace) -> int:
    from tilefold.codegen.gemm.tuned import store_path
    from tilefold.codegen.llvm.gemm.tuning import tune_gemm, tune_gemv
    from tilefold.runtime import num_threads

    threads = args.threads or num_threads()
    print(f"{'micro-kernel':<16} {'model MC/KC/NC':>16} {'measured best':>16} {'speedup':>8}")

    def report(o) -> None:
        m, b = o.model, o.best
        print(f"{o.kernel:<16} {f'{m.mc}/{m.kc}/{m.nc}':>16} {f'{b.mc}/{b.kc}/{b.nc}':>16} "
              f"{o.speedup:>7.2f}x", flush=True)

    tune_gemm(threads=threads, budget_s=args.budget * 2 / 3, report=report)
    print(f"{'GEMV form':<16} {'model ahead/panel':>18} {'measured best':>14} {'speedup':>8}")

    def report_gemv(o) -> None:
        m, b = o.model, o.best
        print(f"{o.kernel:<16} {f'{m.ahead}/{m.panel}':>18} {f'{b.ahead}/{b.panel}':>14} "
              f"{o.speedup:>7.2f}x", flush=True)

    tune_gemv(threads=threads, budget_s=args.budget / 3, report=report_gemv)
    print(f"{threads} thread(s); kept in {store_path()}")
    return 0


def _tune_comm(args: argparse.Namespace) -> int:
    from tilefold.distributed import calibrate

    cal = calibrate.calibrate(args.ranks, args.backend)
    calibrate.save(cal)
    print(f"all_reduce on {cal.world} local {cal.backend} ranks (medians):")
    print(cal.table())
    print(f"alpha {cal.alpha * 1e6:.1f} us per step, beta {1 / cal.beta / 1e9:.2f} GB/s; "
          f"kept in {calibrate.store_path()}")
    return 0


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block, restoring them after."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _file_decisions(args: argparse.Namespace) -> list[Decision]:
    graph, shapes = compile_file(args.file, args.function, args.bind)
    return graph.decisions(*shapes)


def _model_decisions(args: argparse.Namespace) -> list[Decision]:
    if importlib.util.find_spec("torch") is None:
        raise TilefoldError("tilefold tune --model needs PyTorch: pip install torch")
    from tilefold.frontend import report

    first = len(report.reports())
    models.first_call(args.model, "tilefold", args.batch, args.seq, args.layers)
    return [d for graph in report.reports()[first:] for d in graph.decisions()]


def format_decisions(decisions: list[Decision]) -> str:
    """Per distinct group: how often it occurs, where its choice came from, and each measured
    candidate's time, marking the winner (*) and the cost model's pick."""
    groups: dict[str, list[Decision]] = {}
    for d in decisions:
        groups.setdefault(d.problem.describe(), []).append(d)
    lines = []
    counts = {"measured now": 0, "from the tuning database": 0, "one candidate": 0}
    for index, (text, same) in enumerate(groups.items(), 1):
        d = same[0]
        source = ("from the tuning database" if "tuning database" in d.why
                  else "measured now" if d.measured else "one candidate")
        counts[source] += 1
        lines.append(f"group {index}: {text} x{len(same)}, {source}")
        pick = d.candidates[0].key if d.candidates else None
        for key, seconds in sorted(d.measured.items(), key=lambda kv: kv[1]):
            mark = "*" if d.winner is not None and key == d.winner.key else " "
            note = "  (cost model's pick)" if key == pick else ""
            lines.append(f"  {mark} {key:<52} {format_ms(seconds):>10}{note}")
    lines.append(f"{len(groups)} distinct group(s): "
                 + ", ".join(f"{n} {what}" for what, n in counts.items())
                 + " (--again measures the database's groups anew)")
    return "\n".join(lines)
