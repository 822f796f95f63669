"""Where tilefold keeps its on-disk state: compiled kernels, measured peaks, tuning results."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$TILEFOLD_CACHE_DIR, else $XDG_CACHE_HOME/tilefold, else ~/.cache/tilefold (not created)."""
    explicit = os.environ.get("TILEFOLD_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tilefold"
