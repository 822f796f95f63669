"""`tilefold opt FILE -p PIPELINE`: the mlir-opt-like driver over the graph IR."""

from __future__ import annotations

import argparse

import tilefold.distributed  # noqa: F401  (registers the sharding passes with the driver)
from tilefold.passes import driver


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "opt",
        help="parse, transform and print IR (like mlir-opt)",
        description="Run a pass pipeline over an IR file; see `tilefold opt --list-passes`.",
    )
    driver.add_arguments(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    args.debug = args.debug or args.show_traceback  # `tilefold --debug opt` as `opt --debug`
    return driver.run(args)
