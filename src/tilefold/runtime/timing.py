"""Wall-clock timing shared by the benchmarks: samples of one call or of a block of calls, and
medians taken with every contender timed in turn, so that a noisy moment of a shared host hits
all of them alike instead of whichever ran then, beside each one's median timed alone."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tilefold.runtime.thread_pool import park_workers

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


def time_batch(fn: Callable[[], object], seconds: float = 2e-3) -> list[float]:
    """Seconds per call of `fn`, averaged over one batch of calls lasting about `seconds` (its
    size from one call), so the timer's own cost does not swamp a call of a microsecond."""
    start = time.perf_counter()
    fn()
    calls = max(1, int(seconds / max(time.perf_counter() - start, 1e-7)))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return [(time.perf_counter() - start) / calls]


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


# A contender whose median among its peers is this much slower than its median alone was
# disturbed by them (or disturbed itself): its ratios are not evidence.
SLOWED_BY = 0.10


@dataclass(frozen=True)
class Timing:
    """A contender's median seconds per call, timed interleaved with its peers and alone."""

    interleaved: float
    alone: float

    @property
    def slowdown(self) -> float:
        """How many times slower it ran among its peers than alone."""
        return self.interleaved / self.alone

    def slowed(self, tolerance: float = SLOWED_BY) -> bool:
        """Whether the interleaving slowed it by more than `tolerance` (a fraction)."""
        return self.interleaved > self.alone * (1 + tolerance)


def fair_medians(impls: dict[str, Callable[[], object]], rounds: int,
                 sample: Callable[[Callable[[], object]], list[float]] = time_once,
                 settle: float = SETTLE_SECONDS, *, ours: Collection[str] = ("tilefold",),
                 warm_calls: int = 2,
                 park: Callable[[], None] = park_workers) -> dict[str, Timing]:
    """Each implementation's median seconds per call, interleaved (`interleaved_medians`) and in
    a separate pass where it runs `rounds` samples on its own.

    Every sample is prepared alike: before a peer (a name not in `ours`) is timed, tilefold's
    workers are parked, so they take no core from it; then `warm_calls` untimed calls wake the
    contender's own threads (OpenMP, BLAS, tilefold's pool) and bring its data into cache."""
    def prepare(name: str) -> None:
        if name not in ours:
            park()
        for _ in range(warm_calls):
            impls[name]()

    def prepared(name: str) -> Callable[[], list[float]]:
        def run() -> list[float]:
            prepare(name)
            return sample(impls[name])
        return run

    interleaved = interleaved_medians({name: prepared(name) for name in impls}, rounds,
                                      lambda run: run(), settle)
    alone: dict[str, float] = {}
    for name, fn in impls.items():
        prepare(name)
        alone[name] = statistics.median(t for _ in range(rounds) for t in sample(fn))
        if settle:
            time.sleep(settle)
    return {name: Timing(interleaved[name], alone[name]) for name in impls}
