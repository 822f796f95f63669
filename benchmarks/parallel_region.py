"""Cost of an empty parallel region in tilefold's native pool vs a Python `threading.Event` handoff.

Run alone on the machine: `flock /tmp/tilefold-bench.lock python benchmarks/parallel_region.py`.
"""

from __future__ import annotations

import statistics
import threading
import time

from tilefold.runtime import thread_pool


def event_handoff_us(repeats: int = 2000) -> float:
    """Round trip to a Python worker thread and back through two Events (median, µs)."""
    go, done = threading.Event(), threading.Event()
    stop = False

    def worker() -> None:
        while True:
            go.wait()
            go.clear()
            if stop:
                return
            done.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        go.set()
        done.wait()
        done.clear()
        samples.append(time.perf_counter() - start)
    stop = True
    go.set()
    thread.join()
    return statistics.median(samples) * 1e6


def cold_region_us(nthreads: int, idle_s: float = 0.05, repeats: int = 10) -> float:
    """The first region after the workers have gone to sleep on their futex (median, µs)."""
    pool = thread_pool()
    empty = pool.module.address("tilefold_empty_region")
    samples = []
    for _ in range(repeats):
        time.sleep(idle_s)
        start = time.perf_counter()
        pool.run(empty, 0, nthreads)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    pool = thread_pool()
    print(f"pool size {pool.size}")
    print("medians; cold = first region after 50 ms idle (workers asleep on the futex)")
    print(f"{'threads':>7} {'native µs':>10} {'ctypes µs':>10} {'cold µs':>9}")
    for nthreads in sorted({1, 2, pool.size}):
        cost = pool.region_cost(nthreads, repeats=20000)
        native, via_ctypes = cost.native_us, cost.ctypes_us
        cold = cold_region_us(nthreads)
        print(f"{nthreads:>7} {native:>10.2f} {via_ctypes:>10.2f} {cold:>9.1f}")
    print(f"Python threading.Event round trip: {event_handoff_us():.1f} µs (median)")


if __name__ == "__main__":
    main()
