"""Timing candidates on the real machine within a budget, with a progress bar.

`TILEFOLD_TUNE`: unset or 0 = cost model only; 1 = tune with the default budget; a number =
that many seconds for one compile (the first compile with a GEMM also spends part of it on the
GEMM's blocking, `tune_gemm_blocking_once`). `TILEFOLD_RETUNE=1` measures again problems the tuning
database already holds (after a hardware or code change, or a tuning run on a busy host),
replacing their entries. A candidate that fails to build, crashes or computes a
wrong answer scores `inf` with its reason (Triton's autotuner habit) and never wins.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from tilefold.errors import TilefoldError
from tilefold.runtime.timing import interleaved_medians
from tilefold.strategy.problem import Problem

log = logging.getLogger("tilefold.tuning")
DEFAULT_BUDGET_S = 20.0
TOP_K = 3


def retune() -> bool:
    """Whether to measure problems again instead of taking the tuning database's winners."""
    return os.environ.get("TILEFOLD_RETUNE", "").strip() not in ("", "0")


def tune_budget() -> float | None:
    """Seconds of tuning allowed per compile, or None when tuning is off."""
    text = os.environ.get("TILEFOLD_TUNE", "0").strip() or "0"
    try:
        value = float(text)
    except ValueError:
        raise TilefoldError(f"TILEFOLD_TUNE={text!r}: use 0 (off), 1 (on) or a number of "
                            "seconds") from None
    if value <= 0:
        return None
    return DEFAULT_BUDGET_S if value == 1 else value


# (target name, threads) whose GEMM blocking this process has already tuned or found tuned.
_blocking_checked: set[tuple[str, int]] = set()
BLOCKING_SHARE = 0.5  # of one compile's tuning budget, spent once per machine
LAZY_MIN_S = 4.0  # a smaller share cannot time enough rounds (the default budget gives 10 s)


def tune_gemm_blocking_once(target, threads: int, budget: float) -> list:
    """Under `TILEFOLD_TUNE`, the first GEMM this process times or plans refines the cache
    blocking of each f32 micro-kernel the host uses, and the GEMV's parameters, that have no
    measured record yet (`tilefold tune --gemm`'s search, within `BLOCKING_SHARE` of `budget`,
    a third of it for the GEMV), so candidates are timed, and later processes run, with this
    machine's own parameters. Returns the outcomes
    (none once the kernels are tuned, for a target that is not this host, or when the share
    is under `LAZY_MIN_S`: then `tilefold tune --gemm` does it)."""
    from tilefold.codegen.llvm.gemm.tuning import tune_gemm, tune_gemv  # on first use: rare

    key = (target.name, threads)
    share = budget * BLOCKING_SHARE
    if key in _blocking_checked or not target.is_host() or share < LAZY_MIN_S:
        return []
    _blocking_checked.add(key)
    outcomes = tune_gemm(target, threads=threads, budget_s=share * 2 / 3, missing_only=True)
    outcomes += tune_gemv(target, threads=threads, budget_s=share / 3, missing_only=True)
    for o in outcomes:
        log.info("tuned the plan parameters of %s on first use: %s (%.2fx the model's %s)",
                 o.kernel, o.best, o.speedup, o.model)
    return outcomes


def random_inputs(problem: Problem, seed: int = 0) -> list[np.ndarray]:
    """Inputs to time candidates on: the group's constants, random floats and bools, and zeros
    for integers (they may be gather indices, and 0 is valid for every non-empty axis)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for v, t in zip(problem.inputs, problem.in_types(), strict=True):
        if v in problem.constants:
            arrays.append(np.asarray(problem.constants[v], order="C"))  # 0-d stays 0-d
        elif t.dtype.is_float:
            arrays.append(rng.standard_normal(t.shape).astype(t.dtype.np_dtype))
        elif str(t.dtype) == "bool":
            arrays.append(rng.integers(0, 2, t.shape).astype(np.bool_))
        else:
            arrays.append(np.zeros(t.shape, t.dtype.np_dtype))
    return arrays


def empty_outputs(problem: Problem) -> list[np.ndarray]:
    return [np.full(t.shape, np.nan if t.dtype.is_float else 0, t.dtype.np_dtype)
            for t in problem.out_types()]


def measure(runs: dict[str, Callable[[], None]], seconds: float,
            neighbour: Callable[[], None] | None = None) -> dict[str, float]:
    """Median seconds per call of each candidate, timed interleaved: every round calls each
    once (starting one further along each time) until `seconds` are spent, at least 3 rounds.

    A shared host flips between quiet and contended within a second; timed one after another,
    candidates were ranked by when they ran (a tuned MiniLM ran 1.6x slower than the cost
    model's picks). Interleaved, a noisy moment hits all of them alike.

    `neighbour` stands for the kernels around this one in a compiled graph: it runs before each
    call, and once more inside the timed span after it. That charges a kernel for sharing the
    cores with tilefold's spinning workers. (Another pool's threads spinning after a call slow
    the next kernel, not the neighbour's empty region, so no candidate may leave any: extern
    methods run their libraries on one thread.)
    """
    for run in runs.values():
        run()

    def charged(run: Callable[[], None]) -> list[float]:
        if neighbour is not None:
            neighbour()
        start = time.perf_counter()
        run()
        if neighbour is not None:
            neighbour()
        return [time.perf_counter() - start]

    return interleaved_medians(runs, 3, charged, 0.0, seconds=seconds, max_rounds=50)


def agrees(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    """Outputs match the extern reference up to f32 rounding of a reordered computation."""
    for g, w in zip(got, want, strict=True):
        if g.dtype.kind != "f":
            if not np.array_equal(g, w):
                return False
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        scale = max(1.0, float(np.nanmax(np.abs(w64))) if w64.size else 1.0)
        if not np.allclose(g64, w64, rtol=1e-3, atol=1e-4 * scale, equal_nan=True):
            return False
    return True


def progress(items: Iterable, total: int, desc: str) -> Iterator:
    """tqdm (or rich) when installed, else one plain line per item on a terminal."""
    try:
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, leave=False, file=sys.stderr)
        return
    except ImportError:
        pass
    for i, item in enumerate(items):
        if sys.stderr.isatty():
            print(f"\r[tilefold] {desc}: {i + 1}/{total}", end="", file=sys.stderr, flush=True)
        yield item
    if sys.stderr.isatty() and total:
        print(file=sys.stderr)
