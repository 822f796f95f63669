"""Detects the machine this process runs on as a `Target`, and names it by a fingerprint."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from pathlib import Path

import llvmlite.binding as llvm

from tilefold.errors import UnsupportedError
from tilefold.target.host_cpu import host_cpu
from tilefold.target.table import (
    ARCH_TRIPLES,
    closest_chain,
    has_entry,
    table_entry,
    target_names,
)
from tilefold.target.target import Target

HOST_ENV = "TILEFOLD_HOST"  # names a weaker target this host acts as
_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
# Used only when neither sysfs nor sysconf knows (containers without /sys, non-Linux).
_DEFAULT_CACHES = {"l1d": 32 * 1024, "l2": 1024 * 1024, "l3": 8 * 1024 * 1024}
_SYSCONF_NAMES = {
    "l1d": "SC_LEVEL1_DCACHE_SIZE",
    "l2": "SC_LEVEL2_CACHE_SIZE",
    "l3": "SC_LEVEL3_CACHE_SIZE",
}


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _sysfs_caches() -> dict[str, int]:
    found: dict[str, int] = {}
    for index in sorted(_SYSFS_CACHE.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        found.setdefault({1: "l1d", 2: "l2", 3: "l3"}.get(level, f"l{level}"), size)
    return found


def _cache_sizes() -> dict[str, int]:
    """Cache sizes of cpu0 from sysfs, else sysconf, else defaults (l1d/l2 are per core)."""
    sizes = _sysfs_caches()
    for level, sysconf_name in _SYSCONF_NAMES.items():
        if sizes.get(level, 0) > 0:
            continue
        try:
            value = os.sysconf(sysconf_name)
        except (ValueError, OSError):
            value = 0
        sizes[level] = value if value > 0 else _DEFAULT_CACHES[level]
    return sizes


def _host_family(name: str, arch: str, features: frozenset[str]) -> tuple[str, ...]:
    """The host's fallback chain: its table chain if it is a known chip, else the chain of the
    closest chip it has every feature of, else the ISA levels."""
    chain = table_entry(name).family[1:] if has_entry(name) else closest_chain(arch, features)
    runnable = [n for n in chain if table_entry(n).features <= features]
    return (name, *runnable)


@functools.cache
def _detected() -> Target:
    cpu = host_cpu()
    if cpu.arch not in ARCH_TRIPLES:
        raise UnsupportedError(
            f"host architecture {cpu.arch!r} ({cpu.triple}) is not supported; "
            f"tilefold generates code for {', '.join(ARCH_TRIPLES)}"
        )
    caches = _cache_sizes()
    wide = cpu.arch == "x86_64" and "avx512f" in cpu.features
    if cpu.arch == "x86_64":
        vector_bits = 512 if wide else 256 if "avx" in cpu.features else 128
    else:
        vector_bits = 128
    return Target(
        name=cpu.name,
        arch=cpu.arch,
        triple=cpu.triple,
        cpu=cpu.name,
        features=cpu.features,
        vector_bits=vector_bits,
        vector_registers=32 if wide or cpu.arch == "aarch64" else 16,
        l1d_bytes=caches["l1d"],
        l2_bytes=caches["l2"],
        l3_bytes=caches["l3"],
        cores=len(os.sched_getaffinity(0)),
        family=_host_family(cpu.name, cpu.arch, cpu.features),
        disabled_features=cpu.disabled_features,
    )


def host_target(isa: str | None = None) -> Target:
    """This machine, detected once; `isa` narrows it to a named ISA (e.g. "x86-64-v3").

    Without `isa`, the `TILEFOLD_HOST` environment variable names the narrowing, so a strong
    machine can act as a weaker one everywhere (`TILEFOLD_HOST=x86-64-v3 pytest`). Narrowing
    keeps the host's caches and cores, so AVX2 paths can be tested and tuned on an AVX-512
    machine with realistic blocking.
    """
    if isa is None:
        isa = os.environ.get(HOST_ENV, "").strip() or None
    if isa is None or isa == "host":
        return _detected()
    return _narrowed(isa)


@functools.cache
def _narrowed(isa: str) -> Target:
    host = _detected()
    if not has_entry(isa):
        raise UnsupportedError(
            f"cannot narrow host {host.name} to {isa!r}: no such target (check {HOST_ENV}); "
            f"known targets: {', '.join(target_names())}"
        )
    level = table_entry(isa)
    if level.arch != host.arch or not level.features <= host.features:
        missing = ", ".join(sorted(level.features - host.features)) or level.arch
        raise UnsupportedError(
            f"cannot narrow host {host.name} to {isa!r}: this machine lacks {missing}; "
            "use named_target() to cross-compile instead"
        )
    return dataclasses.replace(
        level,
        l1d_bytes=host.l1d_bytes,
        l2_bytes=host.l2_bytes,
        l3_bytes=host.l3_bytes,
        cores=host.cores,
    )


def named_target(name: str) -> Target:
    """A target from the table by name, or the detected machine for "host"."""
    if name == "host":
        return host_target()
    return table_entry(name)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "CPU part")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.cache
def hardware_fingerprint() -> str:
    """A short stable id of this machine's CPU and LLVM, for keying measurements and tuning."""
    host = host_target()
    parts = [
        _cpu_model(),
        host.cpu,
        ",".join(sorted(host.features)),
        str(host.cores),
        f"{host.l1d_bytes}/{host.l2_bytes}/{host.l3_bytes}",
        ".".join(map(str, llvm.llvm_version_info)),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
