"""Where tilefold keeps its on-disk state (kernels, peaks, tuning), and how it writes it safely."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """$TILEFOLD_CACHE_DIR, else $XDG_CACHE_HOME/tilefold, else ~/.cache/tilefold (not created)."""
    explicit = os.environ.get("TILEFOLD_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tilefold"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so readers see the old file or the new one, never a mix.

    Writes a temp file in the same folder, then renames it over `path`; raises OSError (and
    leaves no temp file) when the folder cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
