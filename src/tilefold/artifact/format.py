"""The exported artifact's layout on disk, shared by the exporter and the loader.

An artifact is a directory (a shared library must be a file of its own to be `dlopen`ed, and
the weights a file of their own to be mapped at offset 0):

    manifest.json   what the artifact is: format, tilefold version, function, inputs and
                    outputs (name, dtype, shape), target and the CPU features its code
                    assumes, the layout of array headers, and each part's size, sha256 and
                    `digest64` (below)
    kernels-<id>.so the kernels' object code and the native thread pool, position-independent,
                    with `tf_replay(int64 *table)` running the whole step program; <id> is
                    drawn per export, so a process that loaded an earlier export from this
                    path never gets that library back from `dlopen` (which reuses a loaded
                    library by name); one per target of a chain (`targets` in the
                    manifest), the loaders running the first the host has
    program.json    the step program: buffers, array headers, pointer words to patch, and the
                    native calls with every pointer written as (buffer, offset)
    data.bin        the constants (weights, parameter blocks) as raw bytes, each at a 64-byte
                    aligned offset; mapped copy-on-write, never unpickled
    tilefold_model.h  the header of the C ABI the library also exports (not a part)

Only NumPy-native dtypes cross the artifact's boundary (`DTYPES`).

Integrity. Both loaders check each part before using it, but not by its sha256: the C
runtime's portable SHA-256 took 1.05 s over MiniLM's 90 MB data.bin, and even OpenSSL's
(SHA-NI) takes ~60 ms, most of a 0.1 s load. The sha256 stays in the manifest for people
and tools (`sha256sum`); the loaders verify `digest64`, a keyed block sum of our own that
runs at memory speed in C (~12 ms for 90 MB, SSE2) and in NumPy chunks (~30 ms), and
catches damage (a flipped, lost or moved byte), not malice (nothing is signed):

    the n bytes, zero-padded to a multiple of 8, are little-endian uint64 words w, taken in
    blocks of BLOCK_WORDS (the last may be shorter); K[j] (j < BLOCK_WORDS) is splitmix64's
    j+1-th output from seed 0; for each block, in order,
        s = sum over j of  lo32(w[j] ^ K[j]) * hi32(w[j] ^ K[j]) + w[j]      (mod 2**64)
        state = fmix64(state + s)
    from state = fmix64(n ^ DIGEST_SEED); the digest is the final state, 16 hex digits.

The per-word key makes a word's place within its block count, the chain of fmix64 (a
bijection: MurmurHash3's finalizer) the order of blocks, the added word a change that the
product alone could miss, and n the length. `digest64` here and `tf_digest64` in
`data/aot/digest64.h` (compiled into every library's C runtime) are the two
implementations; `tests/aot/test_digest.py` holds them to each other and to fixed values.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefold.errors import ArtifactError

if TYPE_CHECKING:
    from collections.abc import Callable
    from os import PathLike

    Where = str | PathLike[str]

FORMAT = "tilefold-artifact"
FORMAT_VERSION = 2  # 2: each part's digest64, checked at load (1: sha256 checked)
MANIFEST = "manifest.json"
PROGRAM = "program.json"
DATA = "data.bin"
PARTS = ("library", "program", "data")
_LIBRARY = re.compile(r"kernels-[0-9a-f]{16}\.so")
_PROGRAM = re.compile(r"program(-[0-9]{1,3})?\.json")  # a chain's target's own plan: -<k>
_DATA = re.compile(r"data(-[0-9]{1,3})?\.bin")
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
    import secrets  # the exporter's only (the loader imports what it needs, lazily or not)

    return f"kernels-{secrets.token_hex(8)}.so"


def part_files(root: Where, manifest: dict[str, Any]) -> dict[str, str]:
    """The file of each part (the library's name as the manifest gives it, checked)."""
    parts = manifest.get("parts")
    if not isinstance(parts, dict) or set(parts) != set(PARTS):
        raise ArtifactError(f"{os.path.join(root, MANIFEST)}: the manifest must list the parts "
                            f"{', '.join(sorted(PARTS))}; export the artifact again")
    files = {part: entry.get("file") if isinstance(entry, dict) else None
             for part, entry in parts.items()}
    for part, pattern, shown in (("library", _LIBRARY, "kernels-<16 hex digits>.so"),
                                 ("program", _PROGRAM, f"{PROGRAM} or program-<k>.json"),
                                 ("data", _DATA, f"{DATA} or data-<k>.bin")):
        if not isinstance(files[part], str) or not pattern.fullmatch(files[part]):
            raise ArtifactError(f"{os.path.join(root, MANIFEST)}: the {part} part must be a "
                                f"file {shown} in the artifact; export it again")
    return files


def sha256_file(path: Where) -> str:
    import hashlib  # the exporter's only: the loaders check digest64

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


DIGEST = "digest64"  # the manifest's key of each part's fast digest
BLOCK_WORDS = 32768  # 256 KiB blocks: the keys and a block's scratch stay in L2/L3
DIGEST_SEED = 0x746966F1D5E3A1B7
_M64 = (1 << 64) - 1
_keys: np.ndarray | None = None


def _fmix64(z: int) -> int:
    z ^= z >> 33
    z = z * 0xFF51AFD7ED558CCD & _M64
    z ^= z >> 33
    z = z * 0xC4CEB9FE1A85EC53 & _M64
    return z ^ (z >> 33)


def _block_keys() -> np.ndarray:
    """K: splitmix64's outputs 1 .. BLOCK_WORDS from seed 0 (made once per process)."""
    global _keys
    if _keys is None:  # two threads may both make it: the same array, either one kept
        with np.errstate(over="ignore"):
            z = np.arange(1, BLOCK_WORDS + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        _keys = z ^ (z >> np.uint64(31))
    return _keys


def digest64(buffer: Any, threads: int = 1) -> str:
    """The digest64 of a bytes-like object (bytes, mmap, a contiguous uint8 array), as 16 hex
    digits; read in blocks through block-sized scratch arrays, never copied whole. With
    `threads` > 1 the blocks' sums are split among that many threads (NumPy's loops let go of
    the GIL), then chained in order. (The loader digests data.bin by a checked library's C
    code instead, `data/aot/digest64.h`, which splits the blocks alike.)"""
    view = memoryview(buffer).cast("B")
    try:
        n = view.nbytes
        total = -(-n // 8)  # words, the last zero-padded
        sums = [0] * -(-total // BLOCK_WORDS)
        parts = max(1, min(threads, len(sums) // 4))  # a few blocks each, or not worth it
        bounds = [len(sums) * i // parts for i in range(parts + 1)]
        workers = []
        if parts > 1:
            import threading  # here: a one-thread digest needs none

            workers = [threading.Thread(target=_block_sums, args=(view, sums, first, last))
                       for first, last in itertools.pairwise(bounds[1:])]
        for worker in workers:
            worker.start()
        try:
            _block_sums(view, sums, bounds[0], bounds[1])
        finally:
            for worker in workers:
                worker.join()
    finally:
        view.release()
    state = _fmix64(n ^ DIGEST_SEED)
    for s in sums:
        state = _fmix64((state + s) & _M64)
    return f"{state:016x}"


def _block_sums(view: memoryview, sums: list[int], first: int, last: int) -> None:
    """sums[b] for the blocks first .. last-1 of `view`: the sum over the block's words w of
    lo32(w ^ K) * hi32(w ^ K) + w, mod 2**64."""
    keys = _block_keys()
    words, rest = divmod(view.nbytes, 8)
    mixed, product = np.empty(BLOCK_WORDS, np.uint64), np.empty(BLOCK_WORDS, np.uint64)
    low, shift = np.uint64(0xFFFFFFFF), np.uint64(32)
    for block in range(first, last):
        start = block * BLOCK_WORDS
        w = np.frombuffer(view, "<u8", min(BLOCK_WORDS, words - start), 8 * start)
        if len(w) < BLOCK_WORDS and rest:  # the last bytes, zero-padded to a word
            tail = np.frombuffer(bytes(view[8 * words:]) + bytes(8 - rest), "<u8")
            w = np.concatenate([w, tail])
        count = len(w)
        x, p = mixed[:count], product[:count]
        np.bitwise_xor(w, keys[:count], out=x)
        np.bitwise_and(x, low, out=p)
        np.right_shift(x, shift, out=x)
        np.multiply(p, x, out=p)
        np.add(p, w, out=p)
        sums[block] = int(p.sum(dtype=np.uint64))
        del w


def digest64_file(path: Where) -> str:
    """digest64 of a file's bytes, read through a read-only mapping."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return digest64(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return digest64(mapped)


def read_json(path: Where, what: str) -> dict[str, Any]:
    """The JSON object in `path`, or an `ArtifactError` naming `what` it should have been."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file; is {os.path.dirname(path)} an artifact "
                            "written by `tilefold export`?") from None
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


def check_parts(root: Where, manifest: dict[str, Any], mapped: dict[str, Any] | None = None,
                digest: Callable[[Any], str] = digest64) -> None:
    """Every part the manifest lists exists with its size and digest64 (sizes first: a
    truncated part is named as such), else `ArtifactError`. `mapped` holds the bytes of parts
    the caller has mapped already (the loader's data.bin), digested there by `digest` (the
    loader's: a checked library's C one, on threads) rather than read again."""
    files = part_files(root, manifest)
    parts = manifest["parts"]
    for part, file in files.items():
        entry, path = parts[part], os.path.join(root, file)
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) \
                or not isinstance(entry.get(DIGEST), str):
            raise ArtifactError(f"{os.path.join(root, MANIFEST)}: part {part!r} lacks its size "
                                f"or {DIGEST}")
        if not os.path.isfile(path):
            raise ArtifactError(f"{path}: missing ({part} of the artifact); copy the whole "
                                "directory, or export it again")
        try:
            size = os.stat(path).st_size
            if size != entry["bytes"]:
                state = "truncated" if size < entry["bytes"] else "longer than exported"
                raise ArtifactError(f"{path}: {state} ({size} bytes, the manifest says "
                                    f"{entry['bytes']}); copy it again or export it again")
            given = (mapped or {}).get(part)
            found = digest64_file(path) if given is None else digest(given)
        except OSError as exc:
            raise ArtifactError(f"{path}: cannot be read ({exc})") from None
        if found != entry[DIGEST]:
            raise ArtifactError(f"{path}: {DIGEST} differs from the manifest's (the {part} was "
                                "altered or damaged after export); export the artifact again")
