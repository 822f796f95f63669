"""Refining the GEMM's cache blocking and the GEMV's prefetch distance and panel on the
machine at hand (`tilefold tune --gemm`).

For each micro-kernel the host's shape classes use, the analytic blocking (`model_blocking`)
is the starting point; KC, then MC, then NC are varied around it, every candidate timed
round-robin against the current best on a few products that exercise all three loops, within a
time budget. A candidate replaces the best only when it is faster by more than `MARGIN` (the
geometric mean over the products of median times), so noise leaves the model in place. Winners
go to `tuned.py`'s store, keyed by the hardware fingerprint, where `derive_blocking` finds them.
Only plan parameters change: the compiled kernels are the same, so a tuned blocking costs no
compilation and cannot change a result.

The GEMV (`gemv_config.py`) is tuned the same way, per form (dot, axpy): the prefetch distance,
then the panel, around the model's, on cold weights larger than the last-level cache.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tilefold.codegen.gemm.blocking import Blocking, model_blocking
from tilefold.codegen.gemm.tuned import save_record, tuned_record
from tilefold.codegen.llvm.gemm.gemv import GemvMode
from tilefold.codegen.llvm.gemm.gemv_config import (
    GemvConfig,
    gemv_record,
    model_gemv_config,
    record_name,
)
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import GemvPlan, make_plan
from tilefold.codegen.llvm.gemm.registry import SHAPE_CLASSES, MicroKernel, select_microkernel
from tilefold.target import Target, host_target

MARGIN = 0.02
MIN_ROUNDS = 3
STAGES = (("kc", (0.5, 0.75, 1.25, 1.5, 2.0)), ("mc", (0.5, 0.75, 1.5, 2.0)), ("nc", (0.5, 2.0)))


@dataclass(frozen=True)
class Outcome:
    """What tuning found for one micro-kernel (a `Blocking`) or GEMV form (a `GemvConfig`):
    the model's parameters, the best, and by how much."""

    kernel: str
    model: Any
    best: Any
    speedup: float  # model time / best time, geometric mean over the products
    candidates: int
    shapes: tuple[tuple[int, ...], ...]


def coordinate_search(model: Any, stages, variants: Callable[[Any, str, Any], list],
                      calls: Callable[[Any], list[Callable[[], None]]],
                      budget_s: float) -> tuple[Any, float, int]:
    """One stage per (field, values): `variants(best, field, values)` timed against the best
    so far (`calls(params)`: one call per product), the budget shared by the stages; a variant
    replaces the best only when faster by more than `MARGIN`. (best, speedup, tried)."""
    best, tried, gain = model, 1, 1.0
    for field, values in stages:
        others = variants(best, field, values)
        tried += len(others)
        relative = relative_times([calls(p) for p in (best, *others)], budget_s / len(stages))
        winner = min(range(len(relative)), key=relative.__getitem__)
        if winner and relative[winner] < 1 - MARGIN:
            best, gain = others[winner - 1], gain / relative[winner]
    return best, gain, tried


def shapes_for(kernel: MicroKernel) -> tuple[tuple[int, int, int], ...]:
    """(M, N, K) products on which `kernel`'s blocking matters: K past KC, M past MC, N past NC
    (or, for a kernel that only takes narrow products, as wide as it takes)."""
    if kernel.shape_class == "narrow":
        return ((2048, kernel.nr, 2048), (4096, kernel.nr, 512))
    if kernel.max_n is not None:
        return ((2048, kernel.max_n, 2048), (8192, kernel.max_n // 2, 256))
    return ((1024, 1024, 1024), (384, 3072, 768), (2048, 512, 1536))


def tuned_kernels(target: Target, dtype: str = "f32") -> list[MicroKernel]:
    """The distinct micro-kernels `target` uses for `dtype` across the shape classes."""
    seen: dict[str, MicroKernel] = {}
    for shape_class in SHAPE_CLASSES:
        kern = select_microkernel(target, dtype, shape_class)
        seen.setdefault(kern.name, kern)
    return list(seen.values())


def _variants(best: Blocking, field: str, factors, kernel: MicroKernel) -> list[Blocking]:
    unit = {"mc": kernel.mr, "kc": 16, "nc": kernel.nr}[field]
    base = getattr(best, field)
    sizes = {max(unit, round(base * f / unit) * unit) for f in factors} - {base}
    return [best.with_(**{field: size}) for size in sorted(sizes)]


class _Bench:
    """Plans of one kernel on fixed operands; times blockings round-robin."""

    def __init__(self, target: Target, kernel: MicroKernel, threads: int, shapes, seed: int = 0):
        self.module = gemm_module(target, kernel)
        self.threads = threads
        rng = np.random.default_rng(seed)
        self.operands = [(rng.standard_normal((m, k), dtype=np.float32),
                          rng.standard_normal((k, n), dtype=np.float32),
                          np.empty((m, n), np.float32)) for m, n, k in shapes]

    def plans(self, blocking: Blocking) -> list[Callable[[], None]]:
        calls = []
        for a, b, c in self.operands:
            plan = make_plan(self.module, a, b, c, 0, self.threads, blocking=blocking)
            calls.append(lambda plan=plan, a=a, b=b, c=c: plan(a, b, c))
        return calls


def relative_times(plans: list[list[Callable[[], None]]], seconds: float) -> list[float]:
    """Each candidate's time relative to the first's, `plans[c]` being candidate c's calls (one
    per product): per product, the median over rounds of the ratio within a round (so drift on
    a shared host cancels), then the geometric mean over the products. Candidates run
    round-robin, in a rotating order, for at least `MIN_ROUNDS` rounds and `seconds`."""
    for calls in plans:  # warm: workspace, pages, caches of the operands
        for call in calls:
            call()
    times = [[[] for _ in plans[0]] for _ in plans]
    start, rounds = time.perf_counter(), 0
    while rounds < MIN_ROUNDS or time.perf_counter() - start < seconds:
        order = list(range(len(plans)))
        order = order[rounds % len(order):] + order[:rounds % len(order)]
        for index in order:
            for shape, call in enumerate(plans[index]):
                t0 = time.perf_counter()
                call()
                times[index][shape].append(time.perf_counter() - t0)
        rounds += 1
    return [math.exp(statistics.fmean(
        math.log(statistics.median(x / y for x, y in zip(mine, first, strict=True)))
        for mine, first in zip(per, times[0], strict=True))) for per in times]


def tune_kernel(target: Target, kernel: MicroKernel, threads: int, budget_s: float,
                shapes: tuple[tuple[int, int, int], ...] | None = None) -> Outcome:
    """Coordinate search over KC, MC, NC around the model, `budget_s` seconds in all, on
    `shapes` (default `shapes_for(kernel)`)."""
    model = model_blocking(target, kernel)
    shapes = shapes or shapes_for(kernel)
    bench = _Bench(target, kernel, threads, shapes)
    best, gain, tried = coordinate_search(
        model, STAGES, lambda best, field, factors: _variants(best, field, factors, kernel),
        bench.plans, budget_s)
    return Outcome(kernel.name, model, best, gain, tried, shapes)


def tune_gemm(target: Target | None = None, *, threads: int = 1, budget_s: float = 60.0,
              save: bool = True, report: Callable[[Outcome], None] | None = None,
              shapes: tuple[tuple[int, int, int], ...] | None = None,
              missing_only: bool = False) -> list[Outcome]:
    """Tune every f32 micro-kernel the target uses (`missing_only`: those without a measured
    record on this machine); record the winners (`save`)."""
    target = target or host_target()
    kernels = tuned_kernels(target)
    if missing_only:
        kernels = [k for k in kernels
                   if tuned_record(target, k.name, k.mr, k.nr, threads) is None]
    outcomes = []
    for kernel in kernels:
        outcome = tune_kernel(target, kernel, threads, budget_s / len(kernels), shapes)
        if save:
            best = outcome.best
            save_record(target, kernel.name, {
                "mc": best.mc, "kc": best.kc, "nc": best.nc, "itemsize": 4,
                "model": [outcome.model.mc, outcome.model.kc, outcome.model.nc],
                "speedup": round(outcome.speedup, 4), "threads": threads,
                "shapes": [list(s) for s in outcome.shapes]})
        if report is not None:
            report(outcome)
        outcomes.append(outcome)
    return outcomes


GEMV_STAGES = (("ahead", (0, 32, 64, 128, 256)), ("panel", (0, 2048, 8192)))
GEMV_SHAPES = ((4096, 4096), (11008, 4096))  # (outputs, K): LLaMA's decode projections


def tune_gemv_form(target: Target, mode: GemvMode, threads: int, budget_s: float,
                   shapes: tuple[tuple[int, int], ...]) -> Outcome:
    """Coordinate search over the prefetch distance, then the panel, around the model's, on
    (outputs, K) products whose weights (one matrix per product) exceed the caches."""
    module = gemm_module(target, select_microkernel(target, "f32", "general"))
    rng = np.random.default_rng(0)
    operands = []
    for n, k in shapes:
        w = rng.standard_normal((k, n) if mode == GemvMode.AXPY else (n, k), dtype=np.float32)
        operands.append((n, k, rng.standard_normal((1, k), dtype=np.float32), w,
                         np.empty((1, n), np.float32)))

    def calls(config: GemvConfig) -> list[Callable[[], None]]:
        out = []
        for n, k, x, w, y in operands:
            plan = GemvPlan(module, n, k, w.strides[0] // 4, 1, 1, 0, threads, mode, False, config)
            out.append(lambda plan=plan, x=x, w=w, y=y: plan.run(x, w, y))
        return out

    def variants(best: GemvConfig, field: str, values) -> list[GemvConfig]:
        return [replace(best, **{field: v}) for v in values if v != getattr(best, field)]

    model = model_gemv_config(target, mode)
    best, gain, tried = coordinate_search(model, GEMV_STAGES, variants, calls, budget_s)
    return Outcome(record_name(mode), model, best, gain, tried, shapes)


def tune_gemv(target: Target | None = None, *, threads: int = 1, budget_s: float = 30.0,
              save: bool = True, report: Callable[[Outcome], None] | None = None,
              shapes: tuple[tuple[int, int], ...] | None = None,
              missing_only: bool = False) -> list[Outcome]:
    """Tune both GEMV forms (`missing_only`: those without a measured record on this
    machine) on (outputs, K) `shapes` (default `GEMV_SHAPES`); record the winners (`save`)."""
    target = target or host_target()
    shapes = shapes or GEMV_SHAPES
    modes = [m for m in GemvMode
             if not (missing_only and gemv_record(target, m, threads) is not None)]
    outcomes = []
    for mode in modes:
        outcome = tune_gemv_form(target, mode, threads, budget_s / len(modes), shapes)
        if save:
            save_record(target, outcome.kernel, {
                "ahead": outcome.best.ahead, "panel": outcome.best.panel,
                "model": [outcome.model.ahead, outcome.model.panel],
                "speedup": round(outcome.speedup, 4), "threads": threads,
                "shapes": [list(s) for s in shapes]})
        if report is not None:
            report(outcome)
        outcomes.append(outcome)
    return outcomes
