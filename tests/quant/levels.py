"""The ISA levels the low-precision tests run on: the host's best, then each forced fallback."""

from __future__ import annotations

import dataclasses

from tilefold.target import Target, host_target

_AMX = frozenset({"amx-tile", "amx-bf16", "amx-int8"})
LEVELS = [name for name in ("host", "no-amx", "x86-64-v4", "x86-64-v3")
          if name == "host" or (name == "no-amx" and host_target().has("amx-tile"))
          or name in host_target().family]


def target_for(level: str) -> Target:
    """The host narrowed to `level` (its caches and cores kept, its ISA limited); "no-amx" is
    the host without its AMX tiles, so the AVX-512 BF16/VNNI kernels get their turn."""
    if level == "no-amx":
        host = host_target()
        return dataclasses.replace(host, features=host.features - _AMX)
    return host_target(None if level == "host" else level)
