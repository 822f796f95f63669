"""`tilefold opt FILE -p PIPELINE`: the mlir-opt-like driver over the graph IR."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "opt",
        help="parse, transform and print IR (like mlir-opt)",
        description="Run a pass pipeline over an IR file; see `tilefold opt --list-passes`.",
        add_help=False,
    )
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from tilefold.passes.driver import main as driver_main

    return driver_main(args.argv, prog="tilefold opt")
