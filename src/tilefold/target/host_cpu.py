"""What LLVM says about the CPU this process runs on: its name, features, architecture, triple."""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

import llvmlite.binding as llvm

_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True)
class HostCPU:
    """The raw facts, before they are turned into a `Target` (cheap, needs no cache probing)."""

    name: str
    arch: str
    triple: str
    features: frozenset[str]
    disabled_features: frozenset[str]


@functools.cache
def host_cpu() -> HostCPU:
    """Ask LLVM once per process, like `-mcpu=native`."""
    on: set[str] = set()
    off: set[str] = set()
    for item in llvm.get_host_cpu_features().flatten().split(","):
        if item.startswith("+"):
            on.add(item[1:])
        elif item.startswith("-"):
            off.add(item[1:])
    triple = llvm.get_process_triple()
    machine = platform.machine().lower()
    arch = _ARCH_ALIASES.get(machine, triple.split("-", 1)[0])
    return HostCPU(llvm.get_host_cpu_name(), arch, triple, frozenset(on), frozenset(off))
