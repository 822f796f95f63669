"""The GEMV's plan parameters: how far ahead of each weight load to prefetch, and how many
outputs one pass over K updates; the model's values, or what `tilefold tune --gemm` measured.

Both are run-time slots of `tf_gemv`'s parameter block, so trying or changing them compiles
nothing. `ahead` only moves prefetches, never a result; `panel` (axpy form) splits the thread's
outputs into passes, each still summing all of K in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilefold.codegen.gemm.tuned import measured_record
from tilefold.codegen.llvm.gemm.gemv import GemvMode
from tilefold.target import Target

LINE_BYTES = 64
MODEL_LINES_AHEAD = 4  # each weight stream's prefetch runs this many lines past its loads
_LIMIT = 1 << 24  # elements: no prefetch distance or panel is ever this large


@dataclass(frozen=True)
class GemvConfig:
    """`ahead`: elements past each W load to prefetch. `panel`: outputs per pass over K in the
    axpy form (0: the thread's whole share in one pass)."""

    ahead: int
    panel: int = 0

    def describe(self) -> str:
        panel = "whole share" if not self.panel else f"{self.panel} outputs"
        return f"prefetch {self.ahead * 4} B ahead, panel {panel}"


def record_name(mode: GemvMode) -> str:
    return f"gemv-{mode.name.lower()}"


def model_gemv_config(target: Target, mode: GemvMode) -> GemvConfig:
    """A few lines ahead of the loads on every stream (the hardware prefetcher ramps up on
    each stream only after several misses), one pass over K (short rows of W in separate passes
    defeat the prefetcher: 10-40% slower on znver1). On znver1, 256 B ahead against
    prefetching the line being loaded: +0-2% at 1 thread, up to +15-30% on axpy at 2 (noisy);
    farther (1-4 KiB) was slower."""
    return GemvConfig(ahead=MODEL_LINES_AHEAD * LINE_BYTES // 4, panel=0)


def _fits(record: dict) -> bool:
    ahead, panel = int(record["ahead"]), int(record["panel"])
    return 0 <= ahead < _LIMIT and 0 <= panel < _LIMIT


def gemv_record(target: Target, mode: GemvMode, threads: int) -> dict | None:
    """What `tilefold tune --gemm` measured for this form on this machine at `threads`
    threads, if valid."""
    return measured_record(target, record_name(mode), _fits, threads)


def derive_gemv_config(target: Target, mode: GemvMode, threads: int) -> GemvConfig:
    """The measured parameters on this machine at `threads` threads, else the model's."""
    record = gemv_record(target, mode, threads)
    if record is None:
        return model_gemv_config(target, mode)
    return GemvConfig(ahead=int(record["ahead"]), panel=int(record["panel"]))
