"""What the `bench` suites share: GEMM shapes, geomeans and tables of ratios (timing itself is
`tilefold.runtime.timing`)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TextIO


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
