"""Wall-clock timing shared by the benchmarks: samples of one call or of a block of calls, and
medians taken with every contender timed in turn, so that a noisy moment of a shared host hits
all of them alike instead of whichever ran then."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

# Pause after each sample so spinning worker threads (OpenBLAS, OpenMP, tilefold) settle before
# the next contender is timed.
SETTLE_SECONDS = 0.2


def time_block(fn: Callable[[], object], seconds: float) -> list[float]:
    """Seconds per call of `fn` over a block of about `seconds` (two warm-up calls, at least
    three timed)."""
    fn()
    fn()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def time_once(fn: Callable[[], object]) -> list[float]:
    """Seconds of one call of `fn` (the caller warms it up)."""
    start = time.perf_counter()
    fn()
    return [time.perf_counter() - start]


def time_warm(fn: Callable[[], object]) -> list[float]:
    """Seconds of one call of `fn` right after an untimed one: the timed call finds its data
    (weights) in cache as in a loop of calls, even when other contenders ran in between."""
    fn()
    return time_once(fn)


def interleaved_medians(impls: dict[str, Callable[[], object]], rounds: int,
                        sample: Callable[[Callable[[], object]], list[float]] = time_once,
                        settle: float = SETTLE_SECONDS, *, seconds: float = 0.0,
                        max_rounds: int | None = None) -> dict[str, float]:
    """Median seconds per call of each implementation: in each round every one is sampled in
    turn, starting one further along each time, and the process sleeps `settle` seconds after
    each sample. At least `rounds` rounds; more while `seconds` have not passed, up to
    `max_rounds`."""
    names = list(impls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    deadline = time.perf_counter() + seconds
    done = 0
    while done < rounds or (time.perf_counter() < deadline and done < (max_rounds or rounds)):
        first = done % len(names)
        for name in names[first:] + names[:first]:
            samples[name] += sample(impls[name])
            if settle:
                time.sleep(settle)
        done += 1
    return {name: statistics.median(t) for name, t in samples.items()}
