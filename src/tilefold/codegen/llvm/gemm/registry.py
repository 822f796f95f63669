"""The micro-kernel registry: register tiles per ISA as data, chosen by walking a target's family.

Adding an ISA is adding an entry here (BLIS's `config_registry` and per-architecture tables);
the driver, packing and blocking never look at the ISA. Entries serve a shape class: "general"
(any product: A packed), "rows" (A rows contiguous: read in place, no packing pass) or "narrow"
(C at most NR columns wide, A rows contiguous: tall tiles reading A in place, since each A
element is used once and packing it would cost as much as the product).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from llvmlite import ir

from tilefold.codegen.llvm.gemm.microkernel import TileSpec, emit_microkernel
from tilefold.errors import UnsupportedError
from tilefold.target import Target


@dataclass(frozen=True)
class MicroKernel:
    """A register tile C[MR, NR] for one ISA: shape, needs, and the generator that emits it.

    `family` is the target family this entry serves (a target's family chain is walked in order);
    `a_lanes` > 1 means A elements are used by lane (NEON `fmla v, v, v.s[i]`).
    `a_in_l1` swaps the two innermost loops: each A micro-panel stays in L1 while B micro-panels
    stream from L2 (for tiles whose B micro-panel is too wide to keep in L1 at a good KC).
    `a_direct` reads A in place (its rows contiguous) instead of packing it.
    `b_prefetch` > 0 prefetches B that many k steps ahead (full-height variants).
    `max_n` limits a "rows" kernel to products at most that many columns wide (None: any).
    """

    name: str
    family: str
    dtype: str
    mr: int
    nr: int
    lanes: int
    features: frozenset[str]
    unroll: int = 4
    a_lanes: int = 1
    a_in_l1: bool = False
    a_direct: bool = False
    b_prefetch: int = 0
    shape_class: str = "general"
    max_n: int | None = None
    generator: Callable[[ir.Module, TileSpec], ir.Function] = emit_microkernel

    @property
    def nv(self) -> int:
        return self.nr // self.lanes

    @property
    def streams(self) -> bool:
        """Whether its variants take the driver's prefetch stream (the next B panel, loaded
        while a tile computes: small-M products over large B went from 74 to 90 GFLOP/s with
        pre-packed B on znver3). Not for `a_in_l1` tiles, which sweep B from L2, nor for A
        read in place: those row addresses fill the general registers (the 28-row tile
        spilled the stream's step) and the narrow products served have few panels ahead."""
        return not (self.a_in_l1 or self.a_direct)

    @property
    def m_sizes(self) -> tuple[int, ...]:
        """Row counts that have a variant: MR, then powers of two below it (tails split 7=4+2+1)."""
        return (self.mr, *(p for p in (8, 4, 2, 1) if p < self.mr))

    def spec(self, mr: int, nv: int) -> TileSpec:
        """Variant for `mr` rows by `nv` vectors. Row tails (M's last few rows only) carry little
        work: one rolled, width-dynamic variant per row count serves them all, which cuts the
        module's compile time by a third. A tail of fewer than `TAIL_CHAINS` accumulators keeps
        several sets of them, so that its FMAs do not wait on each other's latency."""
        if mr == self.mr:
            return TileSpec(mr, nv, self.lanes, self.unroll, self.a_lanes, self.a_direct,
                            b_prefetch=self.b_prefetch, stream=self.streams)
        sets = max(1, min(4, TAIL_CHAINS // (mr * self.nv)))
        return TileSpec(mr, self.nv, self.lanes, sets, self.a_lanes, self.a_direct,
                        nv_dynamic=True, sets=sets, stream=self.streams)


SHAPE_CLASSES = ("general", "rows", "narrow")
# Independent FMA chains a tail variant aims for: two FMA pipes times their 4-5 cycle latency.
TAIL_CHAINS = 8
_AVX512 = frozenset({"avx512f"})
_AVX2 = frozenset({"avx2", "fma"})

MICROKERNELS: tuple[MicroKernel, ...] = (
    # Rolled k loop: 24 FMAs a step hide the loop overhead (unroll 4 measured no faster) and the
    # module compiles several times faster. B micro-panels stream from L2: prefetching them
    # 8 k steps ahead gained 2-4% on large products.
    MicroKernel("avx512_8x48", "x86-64-v4", "f32", 8, 48, 16, _AVX512, unroll=1, a_in_l1=True,
                b_prefetch=8),
    # Broadcasting A from its rows in place beat packing it on every suite shape measured:
    # +12-21% at 128-row products, +2-5% at 1024-2048.
    MicroKernel("avx512_8x48_rows", "x86-64-v4", "f32", 8, 48, 16, _AVX512, unroll=1,
                a_in_l1=True, b_prefetch=8, a_direct=True, shape_class="rows"),
    # 28 rows: 29 loads (1 B vector, 28 broadcasts) per 28 FMAs keep both FMA ports near busy.
    MicroKernel("avx512_28x16", "x86-64-v4", "f32", 28, 16, 16, _AVX512, a_direct=True,
                shape_class="narrow"),
    MicroKernel("avx2_6x16", "x86-64-v3", "f32", 6, 16, 8, _AVX2),
    # On AVX2, reading A in place pays only while C is narrow: packing an A panel that at most
    # two B panels use costs more than it saves (8192x16x256 on znver1: 35 GFLOP/s in place,
    # 18-21 packed), while on wider products the packed A block in L2 wins by 3-10%.
    MicroKernel("avx2_6x16_rows", "x86-64-v3", "f32", 6, 16, 8, _AVX2, a_direct=True,
                shape_class="rows", max_n=32),
    MicroKernel("avx2_12x8", "x86-64-v3", "f32", 12, 8, 8, _AVX2, a_direct=True,
                shape_class="narrow"),
    MicroKernel("neon_8x12", "armv8-a", "f32", 8, 12, 4, frozenset({"neon"}), a_lanes=4),
    MicroKernel("generic_4x8", "generic", "f32", 4, 8, 4, frozenset()),
)


class Entry(Protocol):
    """What the family-chain walk reads of a registry row (f32 or low-precision)."""

    name: str
    family: str
    features: frozenset[str]


E = TypeVar("E", bound=Entry)
# Why a registry row cannot run on a target (None: it can).
Refusal = Callable[[Target, Entry], "str | None"]


def missing_features(target: Target, entry: Entry) -> str | None:
    """Why `entry` cannot run on `target` (the features it lacks), or None when it can."""
    if not target.has(*entry.features):
        return f"{target.name} lacks {', '.join(sorted(entry.features - target.features))}"
    return None


def select_entry(target: Target, entries: Iterable[E], refusal: Refusal = missing_features,
                 **fields: object) -> E | None:
    """The kernel selector of every GEMM (BLIS's table lookup): the first row of `entries`
    along the target's family chain whose `fields` match (e.g. dtype="f32") and which
    `refusal` lets run on `target`; None when no family of the chain has one."""
    rows = [e for e in entries if all(getattr(e, k) == v for k, v in fields.items())]
    for family in target.family:
        for entry in rows:
            if entry.family == family and refusal(target, entry) is None:
                return entry
    return None


def select_microkernel(target: Target, dtype: str = "f32", shape_class: str = "general"
                       ) -> MicroKernel:
    """First entry along the target's family chain for `shape_class` whose features the target
    has; a class without one there falls back to "general"."""
    if shape_class not in SHAPE_CLASSES:
        raise UnsupportedError(f"unknown GEMM shape class {shape_class!r}; known: "
                               + ", ".join(SHAPE_CLASSES))
    entry = select_entry(target, MICROKERNELS, dtype=dtype, shape_class=shape_class)
    if entry is not None:
        return entry
    if shape_class != "general":
        return select_microkernel(target, dtype)
    raise UnsupportedError(
        f"no {dtype} GEMM micro-kernel for target {target.name} (family {target.family}); "
        "register one in tilefold.codegen.llvm.gemm.registry or use the 'generic' target")


def microkernel_named(name: str) -> MicroKernel:
    for entry in MICROKERNELS:
        if entry.name == name:
            return entry
    raise UnsupportedError(f"no micro-kernel named {name!r}; known: "
                           + ", ".join(e.name for e in MICROKERNELS))
