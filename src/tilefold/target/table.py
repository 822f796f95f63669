"""Named targets as plain data (BLIS-style): ISA levels and chips, each with a fallback parent."""

from __future__ import annotations

from tilefold.errors import UnsupportedError
from tilefold.target.host_cpu import host_cpu
from tilefold.target.target import Target

# Triples per architecture; "generic" is the host architecture's baseline.
ARCH_TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}
_GENERIC_CPU = {"x86_64": "x86-64", "aarch64": "generic"}

# Feature sets build on each other. Only ISA features that code generation can emit are listed
# (system features such as waitpkg or enqcmd never appear in generated code), but every feature
# the CPU name lets LLVM use is (sse4a for znver4), so `is_host` stays truthful.
_X86_BASE = "sse sse2"
_X86_V3 = (
    f"{_X86_BASE} cx16 popcnt sahf sse3 ssse3 sse4.1 sse4.2 "
    "avx avx2 bmi bmi2 f16c fma lzcnt movbe xsave"
)
_X86_V4 = f"{_X86_V3} avx512f avx512bw avx512cd avx512dq avx512vl"
_ICELAKE_PLUS = (
    f"{_X86_V4} avx512vnni avx512ifma avx512vbmi avx512vbmi2 avx512bitalg avx512vpopcntdq "
    "gfni vaes vpclmulqdq sha adx rdseed clflushopt clwb"
)
_ARM_BASE = "neon fp-armv8"
FEATURE_SETS = {
    "X86_BASE": _X86_BASE,
    "X86_V3": _X86_V3,
    "X86_V4": _X86_V4,
    "ZNVER4": f"{_ICELAKE_PLUS} avx512bf16 sse4a",
    "SPR": f"{_ICELAKE_PLUS} avx512bf16 avx512fp16 avxvnni amx-tile amx-bf16 amx-int8",
    "ARM_BASE": _ARM_BASE,
    "NEOVERSE_V1": f"{_ARM_BASE} fullfp16 dotprod bf16 i8mm sve",
    "APPLE_M1": f"{_ARM_BASE} fullfp16 dotprod",
}

# One row a target: caches are l1d/l2 per core and the chip's l3; "-" = from the host's arch.
# The parent is the next entry of the fallback chain; every chain ends at "generic".
_TABLE_TEXT = """
name            arch     llvm-cpu        features     bits regs caches        parent
generic         -        -               -            128  -    32K/256K/8M   -
x86-64-v3       x86_64   x86-64-v3       X86_V3       256  16   32K/1M/32M    generic
x86-64-v4       x86_64   x86-64-v4       X86_V4       512  32   48K/2M/32M    x86-64-v3
znver4          x86_64   znver4          ZNVER4       512  32   32K/1M/32M    x86-64-v4
sapphirerapids  x86_64   sapphirerapids  SPR          512  32   48K/2M/105M   x86-64-v4
emeraldrapids   x86_64   emeraldrapids   SPR          512  32   48K/2M/320M   sapphirerapids
armv8-a         aarch64  generic         ARM_BASE     128  32   64K/1M/8M     generic
neoverse-v1     aarch64  neoverse-v1     NEOVERSE_V1  128  32   64K/1M/32M    armv8-a
apple-m1        aarch64  apple-m1        APPLE_M1     128  32   128K/3M/8M    armv8-a
"""
_GENERIC_ROW = {
    "x86_64": ("x86_64", "x86-64", "X86_BASE", "16"),
    "aarch64": ("aarch64", "generic", "ARM_BASE", "32"),
}
# The plain ISA levels an unknown host chip falls back to, widest first.
_ISA_LEVELS = ("x86-64-v4", "x86-64-v3", "armv8-a", "generic")


def _rows() -> dict[str, list[str]]:
    lines = [line.split() for line in _TABLE_TEXT.strip().splitlines()[1:]]
    return {cells[0]: cells for cells in lines}


_ROWS = _rows()


def _bytes(size: str) -> int:
    return int(size[:-1]) * {"K": 1024, "M": 1024**2}[size[-1]]


def target_names() -> list[str]:
    """Every name `named_target` accepts, "host" included."""
    return ["host", *_ROWS]


def has_entry(name: str) -> bool:
    """Whether the table has a row called `name` ("host" is not a row)."""
    return name in _ROWS


def _chain(name: str) -> tuple[str, ...]:
    parent = _ROWS[name][7]
    return (name,) if parent == "-" else (name, *_chain(parent))


def table_entry(name: str) -> Target:
    """The table's row for `name` as a `Target` ("generic" takes the host's architecture)."""
    if name not in _ROWS:
        known = ", ".join(target_names())
        raise UnsupportedError(f"unknown target {name!r}; known targets: {known}")
    _, arch, cpu, features, bits, regs, caches, _ = _ROWS[name]
    if arch == "-":
        host_arch = host_cpu().arch
        arch, cpu, features, regs = _GENERIC_ROW.get(host_arch, _GENERIC_ROW["x86_64"])
    l1d, l2, l3 = (_bytes(size) for size in caches.split("/"))
    return Target(
        name=name,
        arch=arch,
        triple=ARCH_TRIPLES[arch],
        cpu=cpu,
        features=frozenset(FEATURE_SETS[features].split()),
        vector_bits=int(bits),
        vector_registers=int(regs),
        l1d_bytes=l1d,
        l2_bytes=l2,
        l3_bytes=l3,
        cores=1,
        family=_chain(name),
    )


def closest_chain(arch: str, features: frozenset[str]) -> tuple[str, ...]:
    """The fallback chain of a chip the table does not name: that of the table's chip with the
    most features, all of which it has (a hypervisor may report a CPU model LLVM names after
    an older chip, e.g. an AMX Xeon as "rocketlake"), else the plain ISA levels."""
    chips = [name for name, row in _ROWS.items()
             if name not in _ISA_LEVELS and row[1] == arch
             and table_entry(name).features <= features]
    if not chips:
        return tuple(isa_levels(arch))
    return table_entry(max(chips, key=lambda name: len(table_entry(name).features))).family


def isa_levels(arch: str) -> list[str]:
    """The plain ISA levels of `arch`, widest first: what an unknown host chip falls back to."""
    return [n for n in _ISA_LEVELS if _ROWS[n][1] in (arch, "-")]
