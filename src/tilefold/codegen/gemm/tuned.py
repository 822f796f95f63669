"""GEMM and GEMV plan parameters measured on this machine: one JSON record per (hardware,
target, micro-kernel or GEMV form, thread count).

`$TILEFOLD_CACHE_DIR/tuning/gemm.json` holds what `tilefold tune --gemm` found:

    {"schema": 2, "entries": {"<fingerprint> <target> <kernel> x1":
        {"mc": 252, "kc": 320, "nc": 2048, "model": [252, 256, 2048], "speedup": 1.04,
         "shapes": [[1024, 1024, 1024], ...], "threads": 1, "tilefold": "0.2.0"},
        "<fingerprint> <target> gemv-axpy x2": {"ahead": 64, "panel": 0, ...}}}

The thread count is part of the key: the best blocking at one thread and at all of them
differ (znver3: 192/384/8192 against 378/512/4096), so a plan reads the record of the thread
count it runs with, and the model where there is none.

`derive_blocking` and `derive_gemv_config` read it; a record that does not fit (MC not a
multiple of MR, a size out of range) or that another tilefold version wrote is ignored with a
warning, so a bad file can slow a product down but never make it wrong. Writes are atomic and
merge under a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tilefold.target import Target, cache_dir, hardware_fingerprint
from tilefold.target.paths import atomic_write
from tilefold.version import __version__

log = logging.getLogger("tilefold.tuning")
SCHEMA = 2  # 2: keys end in the thread count
_LIMIT = 1 << 20  # elements: no block dimension is ever this large
_memory: dict[str, Any] = {}


def store_path() -> Path:
    return cache_dir() / "tuning" / "gemm.json"


def record_key(target: Target, kernel_name: str, threads: int) -> str:
    return f"{hardware_fingerprint()} {target.name} {kernel_name} x{threads}"


def _read() -> dict[str, Any]:
    path = store_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s (re-run `tilefold tune --gemm`)", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        log.warning("ignoring %s: not a schema-%d GEMM tuning file", path, SCHEMA)
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _entries() -> dict[str, Any]:
    path = str(store_path())
    if path not in _memory:
        _memory[path] = _read()
    return _memory[path]


def measured_record(target: Target, name: str, fits: Callable[[dict[str, Any]], bool],
                    threads: int) -> dict[str, Any] | None:
    """The record of `name` on this machine and target at `threads` threads, if one exists
    that this tilefold version wrote and whose values `fits` accepts (it may raise on
    malformed values)."""
    record = _entries().get(record_key(target, name, threads))
    if record is None:
        return None
    try:
        ok = fits(record)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok or record.get("tilefold") != __version__:
        log.warning("ignoring the tuned parameters of %s in %s (they do not fit, or are stale); "
                    "re-run `tilefold tune --gemm`", name, store_path())
        return None
    return record


def tuned_record(target: Target, kernel_name: str, mr: int, nr: int, threads: int
                 ) -> dict[str, Any] | None:
    """The measured blocking of this micro-kernel on this machine, target and thread count,
    if valid."""

    def fits(record: dict[str, Any]) -> bool:
        mc, kc, nc = (int(record[f]) for f in ("mc", "kc", "nc"))
        return (0 < mc < _LIMIT and 0 < kc < _LIMIT and 0 < nc < _LIMIT
                and mc % mr == 0 and nc % nr == 0 and kc % 4 == 0)

    return measured_record(target, kernel_name, fits, threads)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def save_record(target: Target, kernel_name: str, record: dict[str, Any]) -> None:
    """Merge one record (measured at `record["threads"]` threads) into the file (re-read under
    the lock, replaced atomically)."""
    key = record_key(target, kernel_name, int(record["threads"]))
    with _locked():
        entries = _read()
        entries[key] = {**record, "tilefold": __version__}
        data = {"schema": SCHEMA, "entries": entries}
        atomic_write(store_path(), json.dumps(data, indent=1, sort_keys=True).encode())
    _memory.clear()


def forget() -> None:
    """Drop what was read, so the next lookup reads the file again."""
    _memory.clear()
