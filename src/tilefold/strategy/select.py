"""Choosing an implementation per problem: tuning database, else measurement, else cost model.

Every registered method is asked; the answer (`Decision`) keeps all candidates, every
rejection with its reason, measured times and why the winner won, for `tilefold explain`.
A method that fails to propose, build or run is passed over for the next one; in strict mode
(`tilefold.errors.strict()`) that failure raises `FallbackError` instead.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field
from functools import partial

from tilefold.errors import FallbackError, TilefoldError, strict
from tilefold.runtime import source_digest
from tilefold.runtime.thread_pool import thread_pool
from tilefold.strategy import autotune
from tilefold.strategy.method import FAMILIES, METHODS, Candidate, Context, Kernel, Rejection
from tilefold.strategy.problem import Problem, shape_bucket
from tilefold.strategy.tuning_db import TuningDB, key_fields, key_of

log = logging.getLogger("tilefold.tuning")
TUNED = 0  # problems measured in this process (a warm tuning database keeps it at 0)


@dataclass
class Decision:
    """What was considered for one problem and what won."""

    problem: Problem
    candidates: list[Candidate]
    rejections: list[Rejection]
    winner: Candidate | None = None
    kernel: Kernel | None = None
    measured: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    why: str = ""


def propose_all(problem: Problem, ctx: Context) -> tuple[list[Candidate], list[Rejection]]:
    """Ask every method, family by family (FAMILIES' order; within one, as registered); a
    method that raises is a rejection with the error, not a crash."""
    candidates: list[Candidate] = []
    rejections: list[Rejection] = []
    for method in sorted(METHODS.values(), key=lambda m: FAMILIES.index(m.family)):
        try:
            answer = method.propose(problem, ctx)
        except Exception as exc:  # a broken method must not break compilation
            _passed_over(problem, f"method {method.name} failed to propose", exc)
            answer = f"proposing failed: {type(exc).__name__}: {exc}"
        if isinstance(answer, str):
            rejections.append(Rejection(method.name, method.family, answer))
        else:
            candidates.extend(answer)
    candidates.sort(key=lambda c: c.estimate)
    return candidates, rejections


@functools.cache
def _digest(modules: tuple[str, ...]) -> str:
    """The modules' source digest (once a process: the files do not change under it); a
    module without a source file (a method defined in `python -c`) counts by name."""
    try:
        return source_digest(*modules)
    except TilefoldError:
        return "no-source:" + ",".join(modules)


def generators_digest(candidates: list[Candidate]) -> str:
    """A digest of the code behind `candidates`: each proposing method's module and the
    generator modules it names."""
    methods = sorted({c.method for c in candidates})
    modules = [m for name in methods if name in METHODS
               for m in (type(METHODS[name]).__module__, *METHODS[name].generators)]
    return _digest(tuple(dict.fromkeys(modules)))


def db_key(problem: Problem, ctx: Context, candidates: list[Candidate]) -> tuple[str, dict]:
    """The tuning database key of `problem` raced among `candidates`, and its fields."""
    fields = key_fields(problem.signature, [shape_bucket(s) for s in problem.shapes], ctx.threads,
                        candidates=[c.key for c in candidates],
                        generators=generators_digest(candidates))
    return key_of(fields), fields


def decide(problem: Problem, ctx: Context, db: TuningDB, budget: float | None) -> Decision:
    """Pick and build the implementation of `problem` (extern always builds, unless strict mode
    has it decline a group it would run on the reference: then FallbackError)."""
    candidates, rejections = propose_all(problem, ctx)
    decision = Decision(problem, candidates, rejections)
    key, fields = db_key(problem, ctx, candidates)
    entry = None if budget is not None and autotune.retune() else db.lookup(key)
    if entry is not None:
        decision.measured = {k: v for k, v in entry.get("timings", {}).items()
                             if isinstance(v, int | float)}
        for c in candidates:
            if c.key == entry["winner"] and _build(decision, c):
                decision.why = "fastest when measured (tuning database)"
                return decision
        log.info("tuning database winner %s unavailable for %s; choosing again", entry["winner"],
                 problem.describe())
    if budget is not None and len(candidates) > 1:
        _tune(decision, ctx, budget)
        if decision.winner is not None:
            timings = {**decision.measured, **{k: math.inf for k in decision.failures}}
            db.record(key, {**fields, "winner": decision.winner.key,
                            "timings": {k: (v if math.isfinite(v) else "inf")
                                        for k, v in timings.items()},
                            "failures": decision.failures, "problem": problem.describe()})
            return decision
    for c in candidates:
        if _build(decision, c):
            decision.why = "lowest estimated cost (cost model; set TILEFOLD_TUNE=1 to measure)"
            return decision
    reasons = "; ".join([*(f"{r.method}: {r.reason}" for r in rejections),
                         *(f"{k}: {v}" for k, v in decision.failures.items())])
    raise FallbackError(f"no kernel method implements group {problem.describe()} ({reasons})")


def _passed_over(problem: Problem, what: str, exc: Exception) -> None:
    """A method failed on `problem`: FallbackError in strict mode, else a warning (the caller
    goes on to the next method)."""
    message = f"group {problem.describe()}: {what}: {type(exc).__name__}: {exc}"
    if strict():
        raise FallbackError(f"{message} (strict mode: no fallback to another kernel method; "
                            "unset TILEFOLD_STRICT to allow it)") from exc
    log.warning("%s; trying the next one", message)


def _build(decision: Decision, c: Candidate) -> bool:
    try:
        start = time.perf_counter()
        decision.kernel = c.build()
        log.info("built %s in %.1f ms", c.key, (time.perf_counter() - start) * 1e3)
    except Exception as exc:  # a failing method falls back to the next candidate
        decision.failures[c.key] = f"build failed: {type(exc).__name__}: {exc}"
        _passed_over(decision.problem, f"candidate {c.key} failed to build", exc)
        return False
    decision.winner = c
    return True


def _tune(decision: Decision, ctx: Context, budget: float) -> None:
    global TUNED
    TUNED += 1
    problem = decision.problem
    extern = next((c for c in decision.candidates if c.family == "extern"), None)
    top = decision.candidates[:autotune.TOP_K]
    if extern is not None and extern not in top:
        top.append(extern)
    if "matmul" in problem.names:
        autotune.tune_gemm_blocking_once(ctx.target, ctx.threads, budget)
    inputs = autotune.random_inputs(problem)
    want = None
    if extern is not None:
        want = autotune.empty_outputs(problem)
        try:
            extern.build().run(*inputs, *want)
        except Exception as exc:  # inputs the group cannot take: keep the cost model's choice
            log.warning("tuning %s skipped: the reference fails on timing inputs (%s)",
                        problem.describe(), exc)
            return
    pool = thread_pool()
    built: dict[str, tuple[Candidate, Kernel, list]] = {}
    for c in autotune.progress(top, len(top), f"tuning {' -> '.join(problem.names)}"):
        try:
            kernel = c.build()
            outs = autotune.empty_outputs(problem)
            kernel.run(*inputs, *outs)
            if want is not None and not autotune.agrees(outs, want):
                raise ValueError("wrong result against the extern reference")
        except Exception as exc:  # scored inf, fatal only in strict mode
            decision.failures[c.key] = f"{type(exc).__name__}: {exc}"
            _passed_over(problem, f"candidate {c.key} failed when tuned (it scores inf)", exc)
            continue
        built[c.key] = (c, kernel, [*inputs, *outs])
    if not built:
        return
    runs = {key: partial(kernel.run, *arrays) for key, (_, kernel, arrays) in built.items()}
    seconds = max(0.05 * len(runs), budget / 4)
    decision.measured = autotune.measure(
        runs, seconds, pool.empty_region if pool.size > 1 else None)
    best = min(decision.measured, key=decision.measured.get)
    decision.winner, decision.kernel, _ = built[best]
    decision.why = f"fastest of {len(decision.measured)} measured (tuned now)"
