"""Stream layouts kept on disk beside the weights they are built from.

Building a weight's stream layout (`wlayout.py`) reorders every code: about a quarter of a
warm start of SmolLM2 at int4. Where the codes and scales are memory-mapped from files (a
weight cache's entries), the layout is a function of those files' bytes, the layout's own
parameters (format, axis, lanes, decoder, threads) and the code that builds it: `cached(...)`
keys an entry by all of them (each file by its real path, offset, size and modification time),
keeps the layout's bytes as a .npy file and its fields as JSON (never pickled, written
atomically), and memory-maps the bytes in the next process. A missing or damaged entry is
built again; weights not mapped from files are never cached.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Sequence

import numpy as np

from tilefold.codegen.llvm.lowp.decode import Decoder
from tilefold.codegen.llvm.lowp.wlayout import StreamLayout
from tilefold.runtime.buffers import mapped_file
from tilefold.runtime.kernel_cache import source_digest
from tilefold.target import cache_dir
from tilefold.target.paths import atomic_write
from tilefold.version import __version__

# The layout's fields besides its bytes and decoder, as they are saved.
_FIELDS = ("k", "n", "group", "lanes", "groups", "steps", "group_padded", "panels_per_tile",
           "tiles", "code_bytes", "f16_scales", "corrected", "scale_bytes", "chunk_bytes")


def enabled() -> bool:
    return os.environ.get("TILEFOLD_WEIGHT_CACHE", "1") != "0"


def _key(sources: Sequence[np.ndarray], params: tuple) -> str | None:
    """The entry's name, or None where a source is not a region of a mapped file."""
    parts = [__version__, source_digest("tilefold.codegen.llvm.lowp.wlayout",
                                        "tilefold.codegen.llvm.lowp.decode"), repr(params)]
    for array in sources:
        where = mapped_file(array)
        if where is None:
            return None
        path, offset, size = where
        stat = os.stat(path)
        parts += [os.path.realpath(path), str(offset), str(size), str(stat.st_mtime_ns),
                  str(stat.st_size), array.dtype.str, repr(array.shape)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def cached(sources: Sequence[np.ndarray], params: tuple, decoder: Decoder,
           build: Callable[[], StreamLayout]) -> StreamLayout:
    """The layout `build()` makes from `sources` (codes, scales, ...) with `params`, from disk
    where an entry holds it."""
    key = _key(sources, params) if enabled() else None
    if key is None:
        return build()
    folder = cache_dir() / "layouts"
    data_path, fields_path = folder / f"{key}.npy", folder / f"{key}.json"
    layout = _load(data_path, fields_path, decoder)
    if layout is None:
        layout = build()
        fields = {name: getattr(layout, name) for name in _FIELDS}
        fields["decoder"] = repr(layout.decoder)
        data = io.BytesIO()
        np.save(data, layout.data, allow_pickle=False)
        atomic_write(data_path, data.getvalue())
        atomic_write(fields_path, json.dumps(fields).encode())
        layout = _load(data_path, fields_path, decoder) or layout
    return layout


def _load(data_path, fields_path, decoder: Decoder) -> StreamLayout | None:
    """The entry as a layout whose bytes are mapped from its file, or None."""
    try:
        fields = json.loads(fields_path.read_text())
        data = np.load(data_path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if not isinstance(fields, dict) or fields.get("decoder") != repr(decoder) or \
            any(not isinstance(fields.get(name), int | bool) for name in _FIELDS) or \
            data.dtype != np.uint8 or data.shape != \
            (fields["tiles"] * fields["groups"] * fields["chunk_bytes"],):
        return None
    layout = StreamLayout.__new__(StreamLayout)
    for name in _FIELDS:
        setattr(layout, name, fields[name])
    layout.decoder, layout.data = decoder, data
    return layout
