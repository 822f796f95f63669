"""The base every `tilefold bench` suite is registered on: its common arguments, the fair timing of
its contenders, and one table, JSON file and plot for all of them."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from tilefold.cli.inputs import count
from tilefold.errors import TilefoldError
from tilefold.runtime.timing import SETTLE_SECONDS, SLOWED_BY, Timing, fair_medians, time_once

log = logging.getLogger("tilefold.bench")
US = "tilefold"  # the contender every other one is compared with, unless a section says otherwise
FRESH_TIMEOUT_S = 600
TIME_UNITS = {"ms": 1e3, "us": 1e6}  # figures per call, lower is better; any other is a rate


@dataclass
class Shape:
    name: str
    batch: int
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def parse_shape(text: str) -> Shape:
    """`MxNxK` or `BxMxNxK`, e.g. `1024x1024x1024`."""
    parts = text.lower().split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise TilefoldError(f"bad --shape {text!r}; write MxNxK or BxMxNxK, "
                         "e.g. 1024x1024x1024")
    batch = dims[0] if len(dims) == 4 else 1
    m, n, k = dims[-3:]
    return Shape(text, batch, m, n, k)


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def optional_torch() -> Any:
    """PyTorch, or None when it is not installed (its columns are left out)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def thread_counts(text: str) -> list[int]:
    """`--threads 1,2` (`all`: every core this process may run on): the distinct counts in
    order, each at least 1."""
    cores = len(os.sched_getaffinity(0))
    try:
        counts = [cores if t.strip() == "all" else int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise TilefoldError(f"bad --threads {text!r}; write counts like 1, 1,2 or 1,all")
    return sorted(set(counts))


# ---- suites ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Suite:
    """One `tilefold bench NAME`: its own arguments and a `run(args, bench)` filling `bench`;
    the base adds --rounds, --threads, --json and --plot (default rounds and threads per suite;
    `multi_threads` allows a list of counts)."""

    name: str
    doc: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Bench], int | None]
    rounds: int = 3
    threads: str = "all"
    multi_threads: bool = False

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0]

    def add_parser(self, suites: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = suites.add_parser(self.name, help=self.summary, description=self.doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
        add_common_arguments(parser, self)
        self.add_arguments(parser)
        parser.set_defaults(handler=lambda args: run_suite(self, args))
        return parser


def add_common_arguments(parser: argparse.ArgumentParser, suite: Suite) -> None:
    many = "comma-separated thread counts" if suite.multi_threads else "threads"
    parser.add_argument("--rounds", "--runs", type=count(1), default=suite.rounds,
                        help=f"timed rounds per case, interleaved and alone "
                             f"(default {suite.rounds})")
    parser.add_argument("--threads", default=suite.threads,
                        help=f"{many} for every contender, `all` for every core "
                             f"(default {suite.threads})")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="draw the figures as bars (matplotlib)")


def run_suite(suite: Suite, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Check the thread counts, run the suite, then write its JSON and plot."""
    counts = thread_counts(args.threads)
    if len(counts) > 1 and not suite.multi_threads:
        raise TilefoldError(f"bench {suite.name} runs at one thread count, not {args.threads}; "
                            "run it once per count")
    args.thread_counts = counts
    bench = Bench(suite.name, args.rounds, out)
    rc = int(suite.run(args, bench) or 0)
    if rc == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(bench.to_json(), f, indent=1)
        bench.say(f"results written to {args.json}")
    if rc == 0 and args.plot:
        plot(bench, args.plot)
    return rc


# ---- results ---------------------------------------------------------------------------------

@dataclass
class Row:
    """One case of a table (a shape, a block, a model): its lead columns as text, each
    contender's timing, and the work per call (flops, bytes) by contender when the section's
    unit is a rate; `info` goes to the JSON only, `note` after the line."""

    case: str
    lead: str
    timings: dict[str, Timing]
    work: dict[str, float] = field(default_factory=dict)
    note: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def figure(self, name: str, unit: str, alone: bool = False) -> float:
        """The contender's figure in `unit`: ms or us per call, or work per second in
        giga-units (GFLOP/s, GB/s)."""
        seconds = self.timings[name].alone if alone else self.timings[name].interleaved
        if unit in TIME_UNITS:
            return seconds * TIME_UNITS[unit]
        return self.work[name] / seconds / 1e9

    def speedup(self, us: str, peer: str) -> float:
        """How many times faster a call of `us` ran than one of `peer` (interleaved medians)."""
        return self.timings[peer].interleaved / self.timings[us].interleaved


@dataclass
class Section:
    """One table: a title line, the header of the rows' lead text, the unit of the figures
    (`ms` or `us` per call, lower is better, or a rate such as `GFLOP/s`), and `us`'s % of
    `peak` if given."""

    title: str
    lead_head: str
    unit: str
    rows: list[Row] = field(default_factory=list)
    peak: float | None = None
    threads: int | None = None
    us: str = US

    def contenders(self) -> list[str]:
        names = list(dict.fromkeys(n for row in self.rows for n in row.timings))
        return [self.us, *(n for n in names if n != self.us)] if self.us in names else names

    def peers(self) -> list[str]:
        return [n for n in self.contenders() if n != self.us]

    def geomeans(self) -> dict[str, float]:
        """`us`'s geomean speedup over each peer, over the rows that have both."""
        return {p: geomean([r.speedup(self.us, p) for r in self.rows
                            if p in r.timings and self.us in r.timings]) for p in self.peers()}

    def slowed(self) -> list[tuple[str, str, float]]:
        """(case, contender, slowdown) of every contender the interleaving slowed."""
        return [(r.case, n, t.slowdown) for r in self.rows for n, t in r.timings.items()
                if t.slowed()]

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "unit": self.unit, "peak": self.peak,
                "threads": self.threads, "us": self.us, "geomean": self.geomeans(),
                "rows": [_row_json(r, self.unit) for r in self.rows]}


def _row_json(row: Row, unit: str) -> dict[str, Any]:
    contenders = {}
    for name, t in row.timings.items():
        entry: dict[str, Any] = {"interleaved_s": t.interleaved, "alone_s": t.alone,
                                 "slowdown": t.slowdown, "slowed": t.slowed()}
        if unit not in TIME_UNITS:
            entry[unit] = row.figure(name, unit)
            entry[f"{unit} alone"] = row.figure(name, unit, alone=True)
        contenders[name] = entry
    return {"case": row.case, **row.info, "contenders": contenders}


CELL = 17  # "figure/alone!" columns, wider for a longer contender name


def _width(name: str) -> int:
    return max(CELL, len(name) + 2)


def _cell(row: Row, name: str, unit: str) -> str:
    if name not in row.timings:
        return f"{'-':>{_width(name)}}"
    digits = {"ms": 3, "us": 2}.get(unit, 1)
    text = f"{row.figure(name, unit):.{digits}f}/{row.figure(name, unit, alone=True):.{digits}f}"
    return f"{text + ('!' if row.timings[name].slowed() else ' '):>{_width(name)}}"


def format_section(section: Section) -> list[str]:
    """The table's lines: each contender's figure interleaved/alone ('!' where the interleaving
    slowed it by more than 10%), `us`'s % of peak, its speedup over each peer, the geomeans."""
    names, peers, unit = section.contenders(), section.peers(), section.unit
    pct = section.peak is not None
    vs = {p: len(p) + 5 for p in peers}  # "vs NAME" columns
    lines = [section.title + f"; figures in {unit}, interleaved/alone",
             section.lead_head + "".join(f"{n:>{_width(n)}}" for n in names)
             + (f"{'%peak':>7}" if pct else "") + "".join(f"{'vs ' + p:>{vs[p]}}" for p in peers)]
    for row in section.rows:
        line = row.lead + "".join(_cell(row, n, unit) for n in names)
        if pct:
            line += f"{100 * row.figure(section.us, unit) / section.peak:>6.0f}%"
        for p in peers:
            ok = p in row.timings and section.us in row.timings
            line += f"{row.speedup(section.us, p):>{vs[p] - 1}.2f}x" if ok else f"{'-':>{vs[p]}}"
        lines.append(line + row.note)
    if len(section.rows) > 1 and peers:
        means = section.geomeans()
        lines.append(f"{'geomean':<{len(section.lead_head)}}"
                     + " " * (sum(_width(n) for n in names) + (7 if pct else 0))
                     + "".join(f"{means[p]:>{vs[p] - 1}.2f}x" for p in peers))
    for case, name, slowdown in section.slowed():
        lines.append(f"! {case}: {name} ran {slowdown:.2f}x slower interleaved than alone "
                     f"(more than {SLOWED_BY:.0%}): its ratios there are not evidence")
    return lines


class Bench:
    """What a suite's run fills: header lines and tables (printed as they come), the fair
    timing of its contenders, and extra fields for the JSON."""

    def __init__(self, suite: str, rounds: int, out: TextIO | None = None):
        self.suite, self.rounds, self.out = suite, rounds, out  # None: sys.stdout when printing
        self.header: list[str] = []
        self.sections: list[Section] = []
        self.extra: dict[str, Any] = {}

    def say(self, text: str) -> None:
        print(text, file=self.out or sys.stdout, flush=True)

    def note(self, text: str) -> None:
        """A header line: printed now and kept in the JSON."""
        self.header.append(text)
        self.say(text)

    def table(self, section: Section) -> dict[str, float]:
        """Print a finished table and keep it; returns its geomean speedups."""
        self.sections.append(section)
        self.say("\n" + "\n".join(format_section(section)))
        return section.geomeans()

    def measure(self, impls: dict[str, Callable[[], object]],
                sample: Callable[[Callable[[], object]], list[float]] = time_once, *,
                settle: float = SETTLE_SECONDS, ours: Collection[str] = (US,),
                warm_calls: int = 2) -> dict[str, Timing]:
        """Each contender timed fairly (`runtime.timing.fair_medians`) over this run's rounds."""
        return fair_medians(impls, self.rounds, sample, settle, ours=ours, warm_calls=warm_calls)

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "rounds": self.rounds, "header": self.header,
                "slowed_by": SLOWED_BY, **self.extra,
                "sections": [s.to_json() for s in self.sections]}


def plot(bench: Bench, path: str) -> None:
    """One bar chart a table: each contender's interleaved figure per case."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print(f"bench {bench.suite}: --plot needs matplotlib (pip install matplotlib); "
              "no plot written", file=sys.stderr)
        return
    sections = [s for s in bench.sections if s.rows]
    if not sections:
        return
    fig, axes = plt.subplots(len(sections), 1, figsize=(14, 4.5 * len(sections)), squeeze=False)
    for ax, section in zip(axes[:, 0], sections, strict=True):
        names = section.contenders()
        x = np.arange(len(section.rows))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [r.figure(name, section.unit) if name in r.timings else float("nan")
                      for r in section.rows]
            ax.bar(x + i * width, values, width, label=name)
        ax.set_xticks(x + 0.4 - width / 2, [r.case for r in section.rows], rotation=30,
                      ha="right")
        lower = " (lower is better)" if section.unit in TIME_UNITS else ""
        ax.set_ylabel(section.unit + lower)
        ax.set_title(section.title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    bench.say(f"plot written to {path}")


# ---- fresh processes -------------------------------------------------------------------------

def fresh_process_runs(command: list[str], what: str, kinds: Sequence[str] = ("cold", "warm"),
                       env: dict[str, str] | None = None) -> dict[str, str]:
    """Run `command` once per kind in a new process, all sharing one temporary cache directory
    (tilefold's and inductor's, so the user's caches are neither used nor touched): the first
    with empty caches, each later one with what the earlier filled. Its stdout by kind; a
    failed child stops the series, with a warning."""
    outputs: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tilefold-fresh-") as tmp:
        env = {**(os.environ if env is None else env),
               "TILEFOLD_CACHE_DIR": os.path.join(tmp, "tilefold"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
        for kind in kinds:
            try:
                done = subprocess.run(command, capture_output=True, text=True, check=True,
                                      timeout=FRESH_TIMEOUT_S, env=env)
            except subprocess.CalledProcessError as exc:
                why = (exc.stderr or "").strip().splitlines()[-1:] or [f"exit {exc.returncode}"]
                log.warning("%s %s failed: %s", kind, what, why[0])
                break
            except subprocess.TimeoutExpired as exc:
                log.warning("%s %s failed: %s", kind, what, exc)
                break
            outputs[kind] = done.stdout
    return outputs
