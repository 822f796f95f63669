"""The `tilefold` command: one entry point dispatching to its subcommands."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from tilefold.cli import (
    bench,
    cache,
    demo,
    emit,
    explain,
    export,
    generate,
    info,
    opt,
    run,
    shard,
    tune,
)
from tilefold.errors import TilefoldError
from tilefold.version import __version__

COMMANDS = (demo, opt, run, explain, emit, export, tune, info, bench, cache, shard, generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilefold", description="tilefold: a compiler for AI programs."
    )
    parser.add_argument("--version", action="version", version=f"tilefold {__version__}")
    parser.add_argument(
        "--debug", action="store_true", dest="show_traceback",
        help="show Python tracebacks for tilefold errors",
    )
    parser.add_argument(
        "--log",
        default=os.environ.get("TILEFOLD_LOG", ""),
        help="comma-separated loggers to show at INFO: passes,kernels,tuning (or 'all')",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def configure_logging(spec: str) -> None:
    if not spec:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    names = ["tilefold"] if spec == "all" else [f"tilefold.{n.strip()}" for n in spec.split(",")]
    for name in names:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log)
    try:
        return int(args.handler(args) or 0)
    except TilefoldError as exc:
        if args.show_traceback:
            raise
        print(f"tilefold {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
