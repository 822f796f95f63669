"""Choosing an implementation per problem: tuning database, else measurement, else cost model.

The one chooser of every target: the registered methods that propose for the target's
platform (`Method.platforms`) are asked; the answer (`Decision`) keeps all candidates, every
rejection with its reason, measured times and why the winner won, for `tilefold explain`.
Measuring runs on the target's platform (`strategy/platform.py`: its arrays, reference and
timer). A method that fails to propose, build or run is passed over for the next one; in
strict mode (`tilefold.errors.strict()`) that failure raises `FallbackError` instead, and a
candidate with a wrong answer `WrongAnswerError`.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tilefold.errors import FallbackError, TilefoldError, WrongAnswerError, strict
from tilefold.runtime import source_digest
from tilefold.runtime.switch import Switch
from tilefold.strategy import autotune
from tilefold.strategy.method import FAMILIES, METHODS, Candidate, Context, Kernel, Rejection
from tilefold.strategy.problem import Problem
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
    """Ask every method of the target's platform, family by family (FAMILIES' order; within
    one, as registered); a method that raises is a rejection with the error, not a crash."""
    candidates: list[Candidate] = []
    rejections: list[Rejection] = []
    methods = [m for m in METHODS.values() if ctx.platform.name in m.platforms]
    for method in sorted(methods, key=lambda m: FAMILIES.index(m.family)):
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
    platform = ctx.platform
    fields = key_fields(problem.signature, platform.bucket(problem, ctx), platform.threads(ctx),
                        candidates=[c.key for c in candidates],
                        generators=generators_digest(candidates),
                        fingerprint=platform.fingerprint(ctx))
    return key_of(fields), fields


# Set while plans are made for an exported artifact, whose every step must be a native call:
# extern methods (they run Python) are then chosen only where no other method applies.
NATIVE_STEPS = Switch("tilefold_native_steps")
native_steps = NATIVE_STEPS.on


def decide(problem: Problem, ctx: Context, db: TuningDB, budget: float | None) -> Decision:
    """Pick and build the implementation of `problem` (extern always builds, unless strict mode
    has it decline a group it would run on the reference: then FallbackError)."""
    candidates, rejections = propose_all(problem, ctx)
    if NATIVE_STEPS.get():
        candidates = [c for c in candidates if c.family != "extern"] or candidates
    return choose(problem, ctx, candidates, rejections, db, budget)


def choose(problem: Problem, ctx: Context, candidates: list[Candidate],
           rejections: list[Rejection], db: TuningDB, budget: float | None) -> Decision:
    """`decide` among given `candidates` (in the cost model's order): the database's winner,
    else (`budget` seconds of tuning) the fastest measured, else the first that builds."""
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


def _wrong(problem: Problem, c: Candidate, why: str) -> None:
    """A candidate computed another answer: WrongAnswerError in strict mode, else a warning."""
    if strict():
        raise WrongAnswerError(f"group {problem.describe()}: candidate {c.key}: {why} (strict "
                               "mode refuses a wrong candidate)")
    log.warning("group %s: candidate %s: %s; it scores inf", problem.describe(), c.key, why)


def _tune(decision: Decision, ctx: Context, budget: float) -> None:
    """Build, check and time the extern first, then the cost model's first candidates (the
    platform's `race`; while the budget lasts where builds count in it), and keep the
    fastest whose answers match the reference."""
    global TUNED
    TUNED += 1
    problem, platform = decision.problem, ctx.platform
    extern = next((c for c in decision.candidates if c.family == "extern"), None)
    top = decision.candidates[:platform.race] if platform.race is not None \
        else list(decision.candidates)
    if extern is not None and extern not in top:
        top.append(extern)
    top.sort(key=lambda c: c is not extern)  # stable: the rest in the cost model's order
    platform.prepare(problem, ctx, budget)
    inputs = platform.inputs(problem, ctx)
    try:
        want, exact = platform.reference(extern, problem, inputs)
    except Exception as exc:  # inputs the group cannot take: keep the cost model's choice
        log.warning("tuning %s skipped: the reference fails on timing inputs (%s)",
                    problem.describe(), exc)
        return
    start, slowest = time.perf_counter(), 0.0  # the longest build and first run so far
    runs: dict[str, Callable[[], Any]] = {}
    built: dict[str, tuple[Candidate, Kernel]] = {}
    for c in autotune.progress(top, len(top), f"tuning {' -> '.join(problem.names)}"):
        spent = time.perf_counter() - start
        if platform.builds_in_budget and c is not extern and spent + slowest > budget:
            log.info("tuning budget (%.1f s) spent before %s (%.1f s spent, a build takes up "
                     "to %.1f s)", budget, c.key, spent, slowest)
            break
        began = time.perf_counter()
        try:
            kernel = c.build()
            run = platform.runner(kernel, problem, inputs)
            outs = run()
        except Exception as exc:  # scored inf, fatal only in strict mode
            decision.failures[c.key] = f"{type(exc).__name__}: {exc}"
            _passed_over(problem, f"candidate {c.key} failed when tuned (it scores inf)", exc)
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - began)
        if want is None and c is extern:  # the extern's own answers are the reference
            want = outs
        wrong = platform.mismatch(outs, want, problem, exact) if want is not None else None
        if wrong:
            decision.failures[c.key] = wrong
            _wrong(problem, c, wrong)
            continue
        runs[c.key], built[c.key] = run, (c, kernel)
    if not runs:
        return
    decision.measured = platform.measure(runs, budget)
    best = min(decision.measured, key=decision.measured.get)
    decision.winner, decision.kernel = built[best]
    decision.why = f"fastest of {len(decision.measured)} measured (tuned now)"
