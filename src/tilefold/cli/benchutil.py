"""What the `bench` suites share: GEMM shapes, interleaved timing, medians and tables of ratios."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import numpy as np

# Pause after each timed block so spinning worker threads (OpenBLAS, OpenMP, tilefold) settle
# before the next implementation is timed.
SETTLE_SECONDS = 0.2


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
    """`MxNxK` or `BxMxNxK`, e.g. `1024x1024x1024`; exits with a message if malformed."""
    parts = text.lower().split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise SystemExit(f"bench: bad --shape {text!r}; write MxNxK or BxMxNxK, "
                         "e.g. 1024x1024x1024")
    batch = dims[0] if len(dims) == 4 else 1
    m, n, k = dims[-3:]
    return Shape(text, batch, m, n, k)


def time_block(fn: Callable[[], object], seconds: float) -> list[float]:
    """Seconds per call of `fn` over a block of about `seconds` (two warm-up calls, at least
    three timed)."""
    fn()
    fn()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def time_once(fn: Callable[[], object]) -> list[float]:
    """Seconds of one call of `fn` (the caller warms it up)."""
    start = time.perf_counter()
    fn()
    return [time.perf_counter() - start]


def interleaved_medians(impls: dict[str, Callable[[], object]], rounds: int,
                        sample: Callable[[Callable[[], object]], list[float]] = time_once,
                        settle: float = SETTLE_SECONDS) -> dict[str, float]:
    """Median seconds per call of each implementation: in each of `rounds` rounds every one is
    sampled in turn, then the process sleeps `settle` seconds."""
    samples: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            samples[name] += sample(fn)
            time.sleep(settle)
    return {name: float(np.median(t)) for name, t in samples.items()}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


@dataclass
class TableRow:
    """One line of `print_vs_table`: the lead columns as text, figures by name, a note after."""

    lead: str
    figures: dict[str, float]
    note: str = ""


def print_vs_table(lead_head: str, rows: list[TableRow], peers: list[str], peak: float, *,
                   value_width: int = 9, ratio_width: int = 10,
                   out: TextIO = sys.stdout) -> dict[str, float]:
    """Print tilefold's figure and its % of `peak`, each peer's figure, and tilefold's ratio to
    each peer ('-' where a row lacks that peer), one line a row, then the geomean ratios under
    their columns. `lead_head` is the header of the rows' `lead` text. Returns the geomeans."""
    print(lead_head + f"{'tilefold':>10}{'%peak':>7}"
          + "".join(f"{p:>{value_width}}" for p in peers)
          + "".join(f"{'vs ' + p:>{ratio_width}}" for p in peers), file=out)
    ratios: dict[str, list[float]] = {p: [] for p in peers}
    for row in rows:
        tf = row.figures["tilefold"]
        line = f"{row.lead}{tf:>10.1f}{100 * tf / peak:>6.0f}%"
        line += "".join(f"{row.figures.get(p, float('nan')):>{value_width}.1f}" for p in peers)
        for p in peers:
            if p in row.figures:
                ratios[p].append(tf / row.figures[p])
                line += f"{tf / row.figures[p]:>{ratio_width - 1}.2f}x"
            else:
                line += f"{'-':>{ratio_width}}"
        print(line + row.note, file=out)
    means = {p: geomean(v) for p, v in ratios.items()}
    print(f"{'geomean':<{len(lead_head) + 17}}" + " " * value_width * len(peers)
          + "".join(f"{means[p]:>{ratio_width - 1}.2f}x" for p in peers), file=out)
    return means
