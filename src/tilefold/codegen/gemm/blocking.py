"""Cache blocking MC/KC/NC derived from a target's caches and its micro-kernel (BLIS's context)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tilefold.codegen.gemm.registry import MicroKernel
from tilefold.codegen.gemm.tuned import tuned_record
from tilefold.target import Target


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


def derive_blocking(target: Target, kernel: MicroKernel, itemsize: int = 4) -> Blocking:
    """The blocking measured best on this machine (`tilefold tune --gemm`), else the model's."""
    record = tuned_record(target, kernel.name, kernel.mr, kernel.nr)
    if record is not None and record.get("itemsize", 4) == itemsize:
        return Blocking(mc=int(record["mc"]), kc=int(record["kc"]), nc=int(record["nc"]))
    return model_blocking(target, kernel, itemsize)


def model_blocking(target: Target, kernel: MicroKernel, itemsize: int = 4) -> Blocking:
    """Sizes from the caches: a B micro-panel (KC x NR) fills about half of L1 (it is reused by
    every A micro-panel), the packed A block (MC x KC) about half of L2, the packed B block
    (KC x NC) a share of L3 large enough that A is re-packed rarely.

    `a_in_l1` kernels keep the A micro-panel (MR x KC) in L1 instead, a sixth of it (KC 256 at
    48 KB: 3-5% over KC 128 on large products), and sweep the whole B block once per A
    micro-panel, so there the B block must stay in L2 (3/8 of it, beside A and C lines): a
    block spilling to L3 cost 20% on 32x4096x4096.
    """
    if kernel.a_in_l1:
        kc = _round_down(target.l1d_bytes // 6 // (kernel.mr * itemsize), 16)
        b_bytes = target.l2_bytes * 3 // 8
    else:
        kc = _round_down(target.l1d_bytes // 2 // (kernel.nr * itemsize), 16)
        b_bytes = min(target.l3_bytes // 4, 8 << 20)
    mc = _round_down(target.l2_bytes // 2 // (kc * itemsize), kernel.mr)
    nc = _round_down(b_bytes // (kc * itemsize), kernel.nr)
    return Blocking(mc=mc, kc=kc, nc=nc)
