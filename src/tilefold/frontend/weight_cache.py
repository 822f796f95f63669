"""Quantized weights kept on disk, so a model built from a file quantizes each weight once.

Quantizing SmolLM2-135M's weights to int4 in NumPy takes about 1.5 s of a warm start's 4.
`WeightCache(path)` keys entries by the source file (its real path, size and modification
time) and the code that builds and quantizes (`source_digest` of `frontend/llama.py` and
`passes/quantize_weights.py`); each weight is a pair of .npy files (codes as raw bytes, f32
scales: never pickled) under tilefold's cache directory, written atomically, and memory-mapped
by the next process. An entry that fails to load is quantized again and rewritten.
`TILEFOLD_WEIGHT_CACHE=0` turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tilefold.passes.quantize_weights import FORMATS, quantize_weight
from tilefold.runtime import source_digest
from tilefold.target import cache_dir
from tilefold.version import __version__


def enabled() -> bool:
    return os.environ.get("TILEFOLD_WEIGHT_CACHE", "1") != "0"


class WeightCache:
    """Codes and scales of the weights of the file at `path`, by weight name and format."""

    def __init__(self, path: str | os.PathLike):
        stat = os.stat(path)
        text = " ".join([os.path.realpath(path), str(stat.st_size), str(stat.st_mtime_ns),
                         __version__, source_digest("tilefold.frontend.llama",
                                                    "tilefold.passes.quantize_weights")])
        self.dir = cache_dir() / "weights" / hashlib.sha256(text.encode()).hexdigest()[:16]

    def quantized(self, name: str, weight: Callable[[], np.ndarray], fmt: str
                  ) -> tuple[np.ndarray, np.ndarray]:
        """`quantize_weight(weight(), 1, fmt)`, from the cache when it holds it; memory-mapped
        from the cache's files either way, so that pages a kernel no longer reads can leave
        the process (`runtime.buffers.release_pages`)."""
        paths = [self.dir / f"{name}.{fmt}.{part}.npy" for part in ("codes", "scale")]
        cached = _load(*paths, FORMATS[fmt][0].np_dtype)
        if cached is not None:
            return cached
        codes, scale = quantize_weight(weight(), 1, fmt)
        self.dir.mkdir(parents=True, exist_ok=True)
        _save(paths[0], codes.view(np.uint8))
        _save(paths[1], np.ascontiguousarray(scale, np.float32))
        return _load(*paths, codes.dtype) or (codes, scale)


def _load(codes_path: Path, scale_path: Path, code_dtype: np.dtype
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """The entry's codes and scales, memory-mapped, or None where it is missing or damaged."""
    try:
        codes = np.load(codes_path, mmap_mode="r", allow_pickle=False)
        scale = np.load(scale_path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if codes.dtype != np.uint8 or scale.dtype != np.float32 or \
            scale.shape[0] != codes.shape[0]:
        return None
    return codes.view(code_dtype), scale


def _save(path: Path, array: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
