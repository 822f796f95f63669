"""The GEMV's plan parameters: how far ahead of each weight load to prefetch, and how many
outputs one pass over K updates; the model's values, or what `tilefold tune --gemm` measured.

Both are run-time slots of `tf_gemv`'s parameter block, so trying or changing them compiles
nothing. `ahead` only moves prefetches, never a result; `panel` (axpy form) splits the thread's
outputs into passes, each still summing all of K in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilefold.codegen.gemm.gemv import GemvMode
from tilefold.codegen.gemm.tuned import measured_record
from tilefold.target import Target

LINE_BYTES = 64
MODEL_LINES_AHEAD = {GemvMode.DOT: 16, GemvMode.AXPY: 4}  # lines past each stream's loads
_LIMIT = 1 << 24  # elements: no prefetch distance or panel is ever this large


@dataclass(frozen=True)
class GemvConfig:
    """`ahead`: elements past each W load to prefetch. `panel`: outputs per pass over K in the
    axpy form (0: the thread's whole share in one pass). `ramp`: bytes at the start of each
    thread's share the dot form prefetches before its first load (None: `ahead`'s bytes, the
    lines its loads' own prefetches skip)."""

    ahead: int
    panel: int = 0
    ramp: int | None = None

    @property
    def ramp_bytes(self) -> int:
        return self.ahead * 4 if self.ramp is None else self.ramp

    def describe(self) -> str:
        panel = "whole share" if not self.panel else f"{self.panel} outputs"
        return f"prefetch {self.ahead * 4} B ahead ({self.ramp_bytes} B first), panel {panel}"


def record_name(mode: GemvMode) -> str:
    return f"gemv-{mode.name.lower()}"


def model_gemv_config(target: Target, mode: GemvMode) -> GemvConfig:
    """A few lines ahead of the loads on every stream (the hardware prefetcher ramps up on
    each stream only after several misses), one pass over K (short rows of W in separate passes
    defeat the prefetcher: 10-40% slower on znver1). The axpy form reads AXPY_ROWS streams at
    once, 256 B ahead each: on znver1 +0-2% at 1 thread against prefetching the line being
    loaded, up to +15-30% at 2 (noisy), farther (1-4 KiB) slower. The dot form reads one
    stream, which needs more lines in flight on its own: 1 KiB ahead against 256 B on znver3
    at 2 threads, SmolLM2's decode GEMVs replayed (30 layers of each shape), +5-10% per shape
    (2-4 KiB: no better on the larger ones), as the weight-only GEMV found (`wgemv.py`)."""
    return GemvConfig(ahead=MODEL_LINES_AHEAD[mode] * LINE_BYTES // 4, panel=0)


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
