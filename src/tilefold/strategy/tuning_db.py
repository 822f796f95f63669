"""The tuning database: measured winners per (machine, op signature, dtype, shape bucket).

One human-readable JSON file, `$TILEFOLD_CACHE_DIR/tuning/db.json`:

    {"schema": 1, "tilefold": "0.2.0",
     "entries": {"<key>": {"fingerprint": ..., "signature": ..., "bucket": [[128, 768]],
                           "candidates": ["extern.numpy{}", "handwritten.softmax{}"],
                           "generators": "<digest>", "winner": "handwritten.softmax{}",
                           "timings": {...}, "env": {...}}}}

The candidate set and the digest of the generators that proposed it are key fields: a new
method, a dropped one or a changed generator misses every entry measured without it, so the
problem is measured again instead of trusting a winner from a race it did not run.

Readers never lock: writers replace the file atomically (temp file + `os.replace`) under an
exclusive lock on `db.lock`, re-reading inside it so that concurrent tuners merge, not clobber.
A file that does not parse or has another schema is reported, set aside as `db.json.bad`, and
rebuilt; an entry whose fields no longer hash to its key (edited) or that an older tilefold
wrote (stale) is dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tilefold.target import cache_dir, hardware_fingerprint
from tilefold.version import __version__

log = logging.getLogger("tilefold.tuning")
SCHEMA = 1
# Environment knobs that change what is fastest; they are part of every key. The thread count
# is a key field of its own, so TILEFOLD_NUM_THREADS=2 on a 2-CPU host finds the same entries.
ENV_KNOBS = ("TILEFOLD_PIN", "TILEFOLD_SPIN_US")


def env_knobs() -> dict[str, str]:
    return {k: os.environ[k] for k in ENV_KNOBS if k in os.environ}


KEY_FIELDS = ("fingerprint", "signature", "bucket", "threads", "tilefold", "env", "candidates",
              "generators")


def key_fields(signature: str, bucket: list, threads: int, *, candidates: Iterable[str],
               generators: str, fingerprint: str | None = None) -> dict[str, Any]:
    """Everything a measurement depends on (Triton's autotuner cache key, in spirit):
    `candidates` are the keys of the candidates that competed, `generators` a digest of the
    code that proposed and generates them; `fingerprint` is the machine's id (the CPU's
    `hardware_fingerprint` unless given: a GPU's comes from `target.gpu.gpu_fingerprint`)."""
    return {
        "fingerprint": fingerprint or hardware_fingerprint(),
        "signature": signature,
        "bucket": [list(b) for b in bucket],
        "threads": threads,
        "tilefold": __version__,
        "env": env_knobs(),
        "candidates": sorted(candidates),
        "generators": generators,
    }


def key_of(fields: dict[str, Any]) -> str:
    """The entry key: a hash of the key fields."""
    text = json.dumps({k: fields[k] for k in KEY_FIELDS}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# path -> (file stamp, valid entries), shared by every TuningDB of this process.
_PARSED: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}


class TuningDB:
    """The database file; `lookup` reads, `record` merges one entry in atomically."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_dir() / "tuning" / "db.json"

    def _read(self) -> dict[str, Any]:
        """The entries; a corrupt or foreign file is reported, set aside and treated as empty."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("tuning database %s unreadable (%s); tuning afresh", self.path, exc)
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("schema") != SCHEMA:
                raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}"
                                 if isinstance(data, dict) else "not a JSON object")
            entries = data["entries"]
            if not isinstance(entries, dict):
                raise ValueError("'entries' is not an object")
        except (ValueError, KeyError) as exc:
            log.warning("tuning database %s is corrupt or stale (%s); set aside as %s.bad and "
                        "rebuilt", self.path, exc, self.path.name)
            with contextlib.suppress(OSError):
                os.replace(self.path, self.path.with_name(self.path.name + ".bad"))
            return {}
        return {k: e for k, e in entries.items() if _valid(k, e)}

    def entries(self) -> dict[str, Any]:
        """All valid entries, parsed once per version of the file (a compile looks up every
        group: re-parsing and re-hashing the whole file each time cost 0.5 s on MiniLM)."""
        try:
            st = self.path.stat()
        except OSError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        memo = _PARSED.get(self.path)
        if memo is None or memo[0] != stamp:
            memo = _PARSED[self.path] = (stamp, self._read())
        return memo[1]

    def lookup(self, key: str) -> dict[str, Any] | None:
        return self.entries().get(key)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def record(self, key: str, entry: dict[str, Any]) -> None:
        """Merge `entry` under `key` (read-modify-write under the lock, atomic replace)."""
        try:
            with self._locked():
                entries = self._read()
                entries[key] = entry
                body = {"schema": SCHEMA, "tilefold": __version__, "entries": entries}
                with tempfile.NamedTemporaryFile(
                    "w", dir=self.path.parent, prefix=".db.", suffix=".tmp", delete=False
                ) as tmp:
                    json.dump(body, tmp, indent=1, sort_keys=True)
                    tmp.flush()
                    os.fsync(tmp.fileno())
                os.replace(tmp.name, self.path)
        except OSError as exc:
            log.warning("cannot record tuning result in %s (%s); it will be re-measured",
                        self.path, exc)
        _PARSED.pop(self.path, None)


def _valid(key: str, entry: Any) -> bool:
    """Trusted only if its fields still hash to its key, it names a winner and is current."""
    if not isinstance(entry, dict) or not isinstance(entry.get("winner"), str):
        return False
    try:
        return key_of(entry) == key and entry["tilefold"] == __version__
    except (KeyError, TypeError):
        return False
