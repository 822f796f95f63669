"""`tilefold bench SUITE`: benchmarks of tilefold against its peers, one subcommand per suite."""

from __future__ import annotations

import argparse

from tilefold.cli import bench_blocks, bench_gemm, bench_lowp, bench_models

SUITES = {"gemm": bench_gemm, "lowp": bench_lowp, "blocks": bench_blocks, "models": bench_models}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark tilefold against NumPy and PyTorch")
    suites = p.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for name, module in SUITES.items():
        sp = suites.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(sp)
        sp.set_defaults(handler=module.run)
