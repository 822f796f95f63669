"""Cache blocking MC/KC/NC derived from a target's caches and its micro-kernel (BLIS's context).

One derivation serves every GEMM: the f32 micro-kernels and the low-precision dot kernels
(`derive_blocking`, K counted in the kernel's k units: f32 elements or 32-bit k-group words),
and the AMX tile kernels, which keep a B slice in L1 and A over all of K in L2
(`derive_tile_blocking`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

from tilefold.codegen.gemm.tuned import tuned_record
from tilefold.target import Target


class Tile(Protocol):
    """What blocking reads of a registry entry (tilefold.codegen.llvm.gemm.registry.MicroKernel,
    tilefold.codegen.llvm.lowp.kernels.DotKernel)."""

    name: str
    mr: int
    nr: int

    @property
    def a_in_l1(self) -> bool: ...

    @property
    def a_direct(self) -> bool: ...


@dataclass(frozen=True)
class Blocking:
    """Block sizes in elements; MC a multiple of MR, NC of NR. Frozen: override with `with_`."""

    mc: int
    kc: int
    nc: int

    def with_(self, **changes: int) -> Blocking:
        return replace(self, **changes)


def _round_down(x: int, unit: int) -> int:
    return max(unit, x // unit * unit)


def balanced_block(extent: int, block: int, unit: int) -> int:
    """A block size <= `block` (in whole `unit`s) that splits `extent` into equal-ish blocks."""
    if extent <= 0:
        return unit
    nblocks = math.ceil(extent / block)
    return min(block, math.ceil(math.ceil(extent / nblocks) / unit) * unit)


def derive_blocking(target: Target, kernel: Tile, threads: int, itemsize: int = 4,
                    k: int | None = None) -> Blocking:
    """The blocking measured best on this machine at `threads` threads (`tilefold tune
    --gemm`), else the model's."""
    record = tuned_record(target, kernel.name, kernel.mr, kernel.nr, threads)
    if record is not None and record.get("itemsize", 4) == itemsize:
        return Blocking(mc=int(record["mc"]), kc=int(record["kc"]), nc=int(record["nc"]))
    return model_blocking(target, kernel, itemsize, k)


def model_blocking(target: Target, kernel: Tile, itemsize: int = 4,
                   k: int | None = None) -> Blocking:
    """Sizes from the caches: a B micro-panel (KC x NR) fills L1 (it is reused by every A
    micro-panel, whose lines stream past it from L2), the packed A block (MC x KC) fills L2, the
    packed B block (KC x NC) a share of L3 large enough that A is re-packed rarely. On znver3
    (32 KiB L1, 512 KiB L2) KC 512 beat the half-L1 KC 256 by 10% (1 thread) on 1024^2,
    2048^2 and the BERT/MiniLM products, for every MC from 126 to 504 (within 5%), and the
    narrow and rows kernels measured best at the same rule (`tilefold tune --gemm`).

    `a_in_l1` kernels keep the A micro-panel (MR x KC) in L1 instead, a sixth of it (KC 256 at
    48 KB: 3-5% over KC 128 on large products), and sweep the whole B block once per A
    micro-panel, so there the B block must stay in L2 (3/8 of it, beside A and C lines): a
    block spilling to L3 cost 20% on 32x4096x4096.

    `a_direct` kernels read the A block in place, its rows strided, so that they share cache
    sets: the block gets a third of L2 (on znver1 48 x 512 rows beat 252 x 512 by 4-15%).

    `k`, the product's K when the caller knows it, sizes the A block by min(KC, K): a short K
    lets more rows of A share L2.
    """
    if kernel.a_in_l1:
        kc = _round_down(target.l1d_bytes // 6 // (kernel.mr * itemsize), 16)
        b_bytes = target.l2_bytes * 3 // 8
        a_share = 2
    else:
        kc = _round_down(target.l1d_bytes // (kernel.nr * itemsize), 16)
        b_bytes = min(target.l3_bytes // 4, 8 << 20)
        a_share = 3 if kernel.a_direct else 1
    a_kc = kc if k is None else min(kc, k)
    mc = _round_down(target.l2_bytes // a_share // (a_kc * itemsize), kernel.mr)
    nc = _round_down(b_bytes // (kc * itemsize), kernel.nr)
    return Blocking(mc=mc, kc=kc, nc=nc)


def derive_tile_blocking(target: Target, kernel: Tile, k_words: int, rows: int,
                         kstep: int) -> Blocking:
    """Blocks of a tile kernel (AMX: MR x NR blocks of C, K in `kstep`-word tile steps) for
    `k_words` 32-bit words of K and `rows` rows of C per thread; NC is one NR panel.

    The KC x NR slice of a B panel stays in L1 and serves every MR-row block of the MC rows,
    whose A tiles stream from L2; MC rows of packed A over all of K fill a quarter of L2, so
    each B slice is fetched from beyond L2 once per MC rows (with MC = 32 at 2048^2, B was
    re-read from L3 for every 32 rows). Measured on Emerald Rapids (1 thread, 1024^2 bf16,
    512x768x3072 int8, 2048^2 bf16): a third of L1 (KC = 128 words) beats two thirds by 5-7%
    and all of K by 10%, though each K block but the last stores its sums to the thread's MC x
    NR buffer and the next reloads them; a quarter of L2 for A beats half by 0-10% and all of
    it by 20%. Both are balanced so no block is a sliver."""
    kc_most = target.l1d_bytes // 3 // (kernel.nr * 4) // kstep * kstep
    kc = balanced_block(k_words, max(kstep, kc_most), kstep)
    mr = kernel.mr
    mc_most = max(mr, target.l2_bytes // 4 // (k_words * 4) // mr * mr)
    return Blocking(mc=balanced_block(-(-rows // mr) * mr, mc_most, mr), kc=kc, nc=kernel.nr)
