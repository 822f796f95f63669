"""`tilefold bench SUITE`: benchmarks of tilefold against its peers, one subcommand per suite."""

from __future__ import annotations

import argparse

from tilefold.cli import (
    bench_aot,
    bench_blocks,
    bench_gemm,
    bench_llm,
    bench_lowp,
    bench_memory,
    bench_models,
    bench_train,
)
from tilefold.cli.benchutil import Suite

SUITES: dict[str, Suite] = {s.name: s for s in (bench_gemm.SUITE, bench_lowp.SUITE,
                                                bench_memory.SUITE, bench_blocks.SUITE,
                                                bench_models.SUITE, bench_llm.SUITE,
                                                bench_aot.SUITE, bench_train.SUITE)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark tilefold against NumPy, PyTorch and ONNX Runtime")
    suites = p.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for suite in SUITES.values():
        suite.add_parser(suites)
