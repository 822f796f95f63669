"""The exported artifact's layout on disk, shared by the exporter and the loader.

An artifact is a directory (a shared library must be a file of its own to be `dlopen`ed, and
the weights a file of their own to be mapped at offset 0):

    manifest.json   what the artifact is: format, tilefold version, function, inputs and
                    outputs (name, dtype, shape), target and the CPU features its code
                    assumes, the layout of array headers, and each part's size and sha256
    kernels-<id>.so the kernels' object code and the native thread pool, position-independent,
                    with `tf_replay(int64 *table)` running the whole step program; <id> is
                    drawn per export, so a process that loaded an earlier export from this
                    path never gets that library back from `dlopen` (which reuses a loaded
                    library by name)
    program.json    the step program: buffers, array headers, pointer words to patch, and the
                    native calls with every pointer written as (buffer, offset)
    data.bin        the constants (weights, parameter blocks) as raw bytes, each at a 64-byte
                    aligned offset; mapped copy-on-write, never unpickled
    tilefold_model.h  the header of the C ABI the library also exports (not a part)

Only NumPy-native dtypes cross the artifact's boundary (`DTYPES`).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.errors import ArtifactError

FORMAT = "tilefold-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAM = "program.json"
DATA = "data.bin"
PARTS = ("library", "program", "data")
_LIBRARY = re.compile(r"kernels-[0-9a-f]{16}\.so")
ALIGN = 64  # every buffer in data.bin and every buffer the loader allocates
# The replay entry the library exports (the generated `runtime.replay.replay_ir`), and the
# NUL-terminated string of the call signatures it was generated for ("pppp|ppi|..."), which
# the loader checks against the step program's before building the table it reads.
ENTRY = "tf_replay"
SIGNATURES = "tf_replay_signatures"
# Where a NumPy array object keeps data pointer, rank, dims and strides (PyArrayObject_fields
# on 64-bit CPython): kernels read these fields out of the objects they are given, so the
# loader hands them headers laid out alike (`HEADER_WORDS` int64 words, then dims, strides).
HEADER = {"data": 16, "nd": 24, "dims": 32, "strides": 40}
HEADER_WORDS = 8
# tilefold's dtype names of the arrays an artifact takes and returns, as NumPy dtypes.
DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "i64": "int64",
          "i32": "int32", "i8": "int8", "u8": "uint8", "bool": "bool"}


def dtype_name(dtype: np.dtype) -> str | None:
    """tilefold's name of a NumPy dtype an artifact can take or return, else None."""
    for name, np_name in DTYPES.items():
        if np.dtype(dtype) == np.dtype(np_name):
            return name
    return None


def new_library_name() -> str:
    return f"kernels-{secrets.token_hex(8)}.so"


def part_files(root: Path, manifest: dict[str, Any]) -> dict[str, str]:
    """The file of each part (the library's name as the manifest gives it, checked)."""
    parts = manifest.get("parts")
    if not isinstance(parts, dict) or set(parts) != set(PARTS):
        raise ArtifactError(f"{root / MANIFEST}: the manifest must list the parts "
                            f"{', '.join(sorted(PARTS))}; export the artifact again")
    library = parts["library"].get("file") if isinstance(parts["library"], dict) else None
    if not isinstance(library, str) or not _LIBRARY.fullmatch(library):
        raise ArtifactError(f"{root / MANIFEST}: the library part must be a file "
                            "kernels-<16 hex digits>.so in the artifact; export it again")
    return {"library": library, "program": PROGRAM, "data": DATA}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path`, or an `ArtifactError` naming `what` it should have been."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file; is {path.parent} an artifact written by "
                            "`tilefold export`?") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read the {what} ({exc})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: the {what} is not valid JSON ({exc}); the file is damaged "
                            "or not a tilefold artifact: export it again") from None
    if not isinstance(value, dict):
        raise ArtifactError(f"{path}: the {what} is not a JSON object; export it again")
    return value


def check_parts(root: Path, manifest: dict[str, Any]) -> None:
    """Every part the manifest lists exists with its size and sha256 (sizes first: a truncated
    part is named as such), else `ArtifactError`."""
    files = part_files(root, manifest)
    parts = manifest["parts"]
    for part, file in files.items():
        entry, path = parts[part], root / file
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) \
                or not isinstance(entry.get("sha256"), str):
            raise ArtifactError(f"{root / MANIFEST}: part {part!r} lacks its size or digest")
        if not path.is_file():
            raise ArtifactError(f"{path}: missing ({part} of the artifact); copy the whole "
                                "directory, or export it again")
        try:
            size, digest = path.stat().st_size, sha256_file(path)
        except OSError as exc:
            raise ArtifactError(f"{path}: cannot be read ({exc})") from None
        if size != entry["bytes"]:
            state = "truncated" if size < entry["bytes"] else "longer than exported"
            raise ArtifactError(f"{path}: {state} ({size} bytes, the manifest says "
                                f"{entry['bytes']}); copy it again or export it again")
        if digest != entry["sha256"]:
            raise ArtifactError(f"{path}: sha256 differs from the manifest's (the {part} was "
                                "altered after export); export the artifact again")
