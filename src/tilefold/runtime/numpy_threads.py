"""NumPy work split over the process's threads: one-time work on a model's weights (decoding a
file's blocks, quantizing, laying codes out for a kernel) is a loop over independent rows, and
NumPy releases the GIL inside its loops, so row ranges run side by side in Python threads.

Each call sees a piece of about PIECE_ELEMENTS elements: its temporaries stay in cache and are
reused by the allocator piece after piece. A whole weight's temporaries would be fresh
mappings each time, and their page faults (several microseconds a page on a VM, serialized
across threads by the kernel) cost more than the arithmetic. Only NumPy is imported: a GGUF
model's weights are prepared before LLVM is loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tilefold.artifact.pool import pool_threads
from tilefold.runtime.pool_ir import MAX_THREADS

T = TypeVar("T")
PIECE_ELEMENTS = 1 << 16

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _workers(count: int) -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None or _executor._max_workers < count:
            _executor = ThreadPoolExecutor(count, thread_name_prefix="tilefold-numpy")
        return _executor


def by_rows(rows: int, work: Callable[[int, int], T], *, row_elements: int = 1) -> list[T]:
    """`work(lo, hi)` over pieces [lo, hi) of [0, `rows`) (rows of `row_elements` elements),
    consecutive pieces on one thread ($TILEFOLD_NUM_THREADS, or the CPUs allowed; the caller
    is one); the results in row order."""
    step = max(1, PIECE_ELEMENTS // max(1, row_elements))
    pieces = [(lo, min(rows, lo + step)) for lo in range(0, rows, step)] or [(0, 0)]
    threads = min(pool_threads(MAX_THREADS), len(pieces))

    def run(t: int) -> list[T]:
        share = pieces[len(pieces) * t // threads:len(pieces) * (t + 1) // threads]
        return [work(lo, hi) for lo, hi in share]

    rest = [_workers(threads - 1).submit(run, t) for t in range(1, threads)]
    return [*run(0), *(result for future in rest for result in future.result())]
