"""`tilefold cache`: show or clear the on-disk kernel cache and the tuning database."""

from __future__ import annotations

import argparse

from tilefold.runtime import kernel_cache
from tilefold.strategy.tuning_db import TuningDB
from tilefold.target import cache_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="show or clear compiled kernels and tuning results")
    p.add_argument("action", nargs="?", choices=("show", "clear"), default="show")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    db = TuningDB()
    if args.action == "clear":
        removed = kernel_cache.clear()
        had_db = db.path.exists()
        db.path.unlink(missing_ok=True)
        print(f"removed {removed} compiled kernel(s){' and the tuning database' if had_db else ''}")
        return 0
    kernels = kernel_cache.entries()
    size = sum(p.stat().st_size for p in kernels)
    print(f"cache dir: {cache_dir()}")
    print(f"compiled kernels: {len(kernels)} ({size / 1e6:.1f} MB) in {kernel_cache.kernels_dir()}")
    print(f"tuning database: {len(db.entries())} entr(y/ies) in {db.path}")
    return 0
