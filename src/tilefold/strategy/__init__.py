"""The kernel framework: methods compete per fused group on a cost model, tuning and a database.

    ctx = context()                      # the host, its measured ceilings, the thread count
    decision = decide(Problem.of(op, shapes), ctx, TuningDB(), tune_budget())
    decision.kernel.run(*inputs, *outputs, *decision.kernel.scratch_arrays())

A method is a `Method` subclass decorated with `register_method` in its file under
`strategy/methods/` (imported below, so every shipped method is registered); the five families
are hand-written, auto-codegen, building blocks, LTO and extern (ARCHITECTURE.md, "The kernel
framework").
"""

from __future__ import annotations

from tilefold.runtime import num_threads
from tilefold.strategy import methods  # registers every shipped method
from tilefold.strategy.autotune import tune_budget
from tilefold.strategy.cost import gpu_machine, machine_for
from tilefold.strategy.method import (
    FAMILIES,
    METHODS,
    Candidate,
    Context,
    Kernel,
    Method,
    Rejection,
    register_method,
    unregister_method,
)
from tilefold.strategy.platform import GPUPlatform, Platform, Timer
from tilefold.strategy.problem import Problem
from tilefold.strategy.select import Decision, decide
from tilefold.strategy.tuning_db import TuningDB
from tilefold.target import Target, host_target
from tilefold.target.gpu import GPUTarget


def builtin_methods() -> list[Method]:
    """One instance of every method tilefold ships, in family order."""
    return list(methods.BUILTIN.values())


def register_builtin_methods() -> None:
    """Register again any shipped method that was unregistered (importing this package
    registers them all; later calls are no-ops)."""
    for method in builtin_methods():
        if method.name not in METHODS:
            register_method(method)


def context(target: Target | GPUTarget | None = None, threads: int | None = None,
            timer: Timer | None = None, min_size: int = 1) -> Context:
    """The host (or `target`) with its measured ceilings, for `threads` threads; a GPU
    target with its published ceilings and its platform, timed by `timer` (milliseconds a
    call; default `platform.device_timer`); `min_size`: the least size of any symbolic dim."""
    if isinstance(target, GPUTarget):
        return Context(target, gpu_machine(target), GPUPlatform(timer), min_size=min_size)
    target = target or host_target()
    return Context(target, machine_for(target, threads or num_threads()), min_size=min_size)


__all__ = [
    "FAMILIES",
    "METHODS",
    "Candidate",
    "Context",
    "Decision",
    "Kernel",
    "Method",
    "Platform",
    "Problem",
    "Rejection",
    "TuningDB",
    "builtin_methods",
    "context",
    "decide",
    "register_builtin_methods",
    "register_method",
    "tune_budget",
    "unregister_method",
]
