"""The on-disk cache of compiled object code: complete keys, checked entries, atomic writes."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from tilefold.errors import TilefoldError
from tilefold.target import Target, cache_dir
from tilefold.target.paths import atomic_write

log = logging.getLogger("tilefold.kernels")

# Bump when anything that shapes object code outside the key changes (code model, TM options).
FORMAT_VERSION = 1
_MAGIC = b"TFKOBJ1\n"
_LENGTH = struct.Struct("<I")
_MAX_HEADER = 1 << 20


@dataclass(frozen=True)
class CacheEntry:
    """One compiled module as stored: its object code and what the loader needs to know."""

    name: str
    data: bytes
    exports: tuple[str, ...]
    compile_seconds: float


@functools.cache
def _versions() -> str:
    try:
        tilefold_version = importlib.metadata.version("tilefold")
    except importlib.metadata.PackageNotFoundError:
        tilefold_version = "unknown"
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    return f"tilefold {tilefold_version}; llvmlite {llvmlite.__version__}; llvm {llvm_version}"


def cache_key(llvm_ir: str, target: Target, opt_level: int) -> str:
    """sha256 of everything that decides the object code."""
    return _digest("ir", llvm_ir, target, opt_level)


def source_key(fingerprint: str, target: Target, opt_level: int) -> str:
    """Like `cache_key`, from a generator's fingerprint (its source and parameters) instead of
    the IR it would emit, so a cache hit needs no IR at all; never equal to an IR key."""
    return _digest("source", fingerprint, target, opt_level)


def _digest(kind: str, text: str, target: Target, opt_level: int) -> str:
    digest = hashlib.sha256()
    for part in (
        f"format {FORMAT_VERSION}",
        _versions(),
        target.triple,
        target.cpu,
        target.llvm_features(),
        f"opt {opt_level}",
        kind,
        text,
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def kernels_dir() -> Path:
    """Where entries live: <cache_dir>/kernels."""
    return cache_dir() / "kernels"


def entry_path(key: str) -> Path:
    return kernels_dir() / f"{key}.tfko"


def _decode(blob: bytes, key: str) -> CacheEntry:
    """The entry in `blob`, or ValueError saying why it cannot be trusted."""
    if not blob.startswith(_MAGIC):
        raise ValueError("not a tilefold kernel entry (bad magic)")
    start = len(_MAGIC) + _LENGTH.size
    if len(blob) < start:
        raise ValueError("truncated header")
    (length,) = _LENGTH.unpack_from(blob, len(_MAGIC))
    if length > _MAX_HEADER or len(blob) < start + length:
        raise ValueError("truncated header")
    try:
        header = json.loads(blob[start : start + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable header ({exc})") from exc
    if not isinstance(header, dict) or header.get("key") != key:
        raise ValueError("entry belongs to another key")
    data = blob[start + length :]
    if len(data) != header.get("size"):
        raise ValueError(f"object is {len(data)} bytes, header says {header.get('size')}")
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise ValueError("object checksum mismatch")
    return CacheEntry(
        name=str(header.get("name", "")),
        data=data,
        exports=tuple(header.get("exports", ())),
        compile_seconds=float(header.get("compile_seconds", 0.0)),
    )


def load(key: str) -> CacheEntry | None:
    """The entry for `key`; None when missing, or unusable (logged: it will be rebuilt)."""
    path = entry_path(key)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("kernel cache entry %s unreadable (%s); recompiling", path, exc)
        return None
    try:
        return _decode(blob, key)
    except ValueError as exc:
        log.warning("kernel cache entry %s ignored: %s; recompiling", path, exc)
        return None


def store(key: str, entry: CacheEntry, target: Target) -> None:
    """Write atomically (temp file + rename); a failure only costs a recompile later (logged)."""
    header = json.dumps(
        {
            "key": key,
            "name": entry.name,
            "triple": target.triple,
            "cpu": target.cpu,
            "exports": list(entry.exports),
            "size": len(entry.data),
            "sha256": hashlib.sha256(entry.data).hexdigest(),
            "compile_seconds": entry.compile_seconds,
        },
        sort_keys=True,
    ).encode()
    blob = _MAGIC + _LENGTH.pack(len(header)) + header + entry.data
    path = entry_path(key)
    try:
        atomic_write(path, blob)
    except OSError as exc:
        log.warning("cannot write kernel cache entry %s (%s); continuing uncached", path, exc)


def entries() -> list[Path]:
    """Every stored entry (for `tilefold cache` style listings)."""
    return sorted(kernels_dir().glob("*.tfko"))


def clear() -> int:
    """Delete every entry and leftover temp file; returns how many entries went."""
    stored = entries()
    for path in [*stored, *kernels_dir().glob(".*.tmp")]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return len(stored)


@functools.cache
def source_digest(*modules: str) -> str:
    """A digest of these modules' source files (every file of a package): part of every
    fingerprint of IR they generate."""
    digest = hashlib.sha256()
    for module in modules:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise TilefoldError(f"no source for {module} to fingerprint generated code by")
        files = [Path(spec.origin)]
        if spec.submodule_search_locations:
            files = sorted(Path(spec.origin).parent.glob("*.py"))
        for path in files:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
