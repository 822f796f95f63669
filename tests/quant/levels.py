"""The ISA levels the low-precision tests run on: the host's best, then each forced fallback."""

from __future__ import annotations

from tilefold.target import Target, host_target

LEVELS = [name for name in ("host", "x86-64-v4", "x86-64-v3")
          if name == "host" or name in host_target().family]


def target_for(level: str) -> Target:
    """The host narrowed to `level` (its caches and cores kept, its ISA limited)."""
    return host_target(None if level == "host" else level)
