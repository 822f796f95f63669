"""tilefold's GPU config tuner: the candidates for one GPU problem (the cost model's configs of
the GEMM or attention template and an extern, cuBLAS or SDPA through torch) timed within a
budget, the winner kept in the tuning database under the GPU's fingerprint, so that a warm
process builds and times nothing else.

    tuner = GPUTuner(target)                    # TILEFOLD_TUNE's budget, do_bench on a GPU
    choice = tuner.choose(signature, tensors, candidates)
    outputs = choice.run(tensors)

Candidates come in the cost model's order (see `gemm_candidates`); untuned, the first one that
builds runs. Tuning (`TILEFOLD_TUNE`, as on the CPU) times the extern first, whatever the
budget, so the winner is never slower than it, then the others in order while the budget
lasts, a candidate's compile counted in it (one is not started when the slowest build so far
would overrun it). Every candidate's first outputs are checked against a reference: the
extern run on f32 copies of the tensors (or the caller's `reference`; the extern's own
outputs where neither runs), at a tolerance by the output's dtype and the terms each output
sums (`GPUCandidate.reduced`: a GEMM's K), so a dropped K block fails. One that fails to build
or raises scores `inf` with its reason, logged, and never wins; one with a wrong answer too,
except in strict mode, where it raises `WrongAnswerError`. The timer is injected
(`timer(fn) -> milliseconds`): `triton.testing.do_bench`'s median on a GPU, the median of
three `perf_counter` runs under Triton's interpreter, and a deterministic fake in tests.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilefold.codegen.triton.attention_config import AttentionConfig, propose_attention_configs
from tilefold.codegen.triton.gemm_config import GemmConfig, propose_configs
from tilefold.codegen.triton.launch import interpreting
from tilefold.errors import CompileError, UnsupportedError, strict
from tilefold.runtime import source_digest
from tilefold.strategy.autotune import retune, tune_budget
from tilefold.strategy.tuning_db import TuningDB, key_fields, key_of
from tilefold.target.gpu import GPUTarget, gpu_fingerprint

log = logging.getLogger("tilefold.tuning")
Timer = Callable[[Callable[[], Any]], float]  # milliseconds one call of fn takes
Runner = Callable[[Sequence[Any]], list[Any]]  # tensors in, output tensors out
EXTERN_GEMM = "extern.torch.matmul"
EXTERN_ATTENTION = "extern.torch.sdpa"
# unit roundoff of an output's dtype (the answer check's tolerance, `_mismatch`)
ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11,
            "bfloat16": 2.0 ** -8, "float8_e4m3fn": 2.0 ** -4}
F32_ROUNDOFF = 2.0 ** -24
_UNSET: Any = object()


class WrongAnswerError(CompileError):
    """A tuning candidate computed another answer than the reference (strict mode)."""


@dataclass(frozen=True)
class GPUCandidate:
    """One way to run a problem: `key` names it in the database, `build()` compiles it and
    returns its runner; an `extern` (a library kernel) is the reference the others match."""

    key: str
    build: Callable[[], Runner]
    extern: bool = False
    reduced: int = 1  # terms summed into each output element (a GEMM's K): the tolerance


@dataclass
class GPUChoice:
    """The candidate that runs, why, and what was measured (ms; `inf` for a failure)."""

    key: str
    run: Runner
    why: str
    timings: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def config_key(config: GemmConfig | AttentionConfig) -> str:
    """The database name of a GEMM or attention template config."""
    c = config
    if isinstance(c, AttentionConfig):
        return f"triton.attention{{{c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}}}"
    persistent = f" p{c.persistent}" if c.persistent else ""  # the TMA variant's programs
    return (f"triton.gemm{{{c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} w{c.num_warps} "
            f"s{c.num_stages} k{c.split_k}{persistent}}}")


def config_candidates(configs: Sequence[Any], template: Callable[[Any], Runner] | None,
                      extern_key: str, extern: Runner | None, reduced: int = 1
                      ) -> list[GPUCandidate]:
    """A template at each of `configs` (`template(config)` builds one; None: the template
    refuses the problem), in their order, then the extern (None: there is none); each output
    element sums `reduced` terms."""
    out = [GPUCandidate(config_key(c), functools.partial(template, c), reduced=reduced)
           for c in configs] if template is not None else []
    if extern is not None:
        out.append(GPUCandidate(extern_key, lambda: extern, extern=True, reduced=reduced))
    return out


def gemm_candidates(target: GPUTarget, mnk: tuple[int, int, int], dtype: str,
                    template: Callable[[GemmConfig], Runner] | None, extern: Runner | None,
                    limit: int = 4, tma: bool = False, out_dtype: str = "f32",
                    fp8_fast_accum: bool = False) -> list[GPUCandidate]:
    """The GEMM template at the first `limit` configs `propose_configs` gives for an M x N x K
    GEMM whose dot reads `dtype` (with `tma`, when the operands suit tensor descriptors, one
    more on sm_90: the first's persistent TMA twin, second, sized for C in `out_dtype`), then
    the extern (e.g. torch.matmul plus the epilogue); `fp8_fast_accum`: an fp8 template's
    accumulation mode."""
    configs = propose_configs(target, *mnk, dtype, limit=limit, tma=tma, out_dtype=out_dtype,
                              fp8_fast_accum=fp8_fast_accum) if template else []
    return config_candidates(configs, template, EXTERN_GEMM, extern, reduced=mnk[2])


def attention_candidates(target: GPUTarget, q: Any, k: Any, dtype: str,
                         template: Callable[[AttentionConfig], Runner],
                         extern: Runner | None, limit: int = 4) -> list[GPUCandidate]:
    """The attention template at the first `limit` configs `propose_attention_configs` gives
    for q [B, H, Sq, D] over k [B, Hkv, Sk, D] in `dtype`, then the extern (torch's SDPA)."""
    b, h, sq, d = q.shape
    configs = propose_attention_configs(target, b * h, sq, k.shape[2], d, dtype, limit=limit)
    return config_candidates(configs, template, EXTERN_ATTENTION, extern,
                             reduced=int(k.shape[2]) + d)


def default_timer(fn: Callable[[], Any]) -> float:
    """Milliseconds per call: `triton.testing.do_bench`'s median on a GPU; under the
    interpreter (no GPU), the median of three `perf_counter` runs after a warm-up."""
    if not interpreting():
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))
    fn()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return sorted(runs)[1]


@functools.cache
def generators_digest() -> str:
    """The digest of the code that proposes, generates and times GPU candidates."""
    return source_digest("tilefold.codegen.triton", __name__)


class GPUTuner:
    """Chooses among `GPUCandidate`s for `target`; `budget` is seconds of measuring per problem
    (default: `TILEFOLD_TUNE`'s; None: no measuring). `timed` and `built` count the timer
    calls and candidate builds this tuner made (a warm database keeps them at 0 and 1)."""

    def __init__(self, target: GPUTarget, *, timer: Timer | None = None,
                 budget: float | None = _UNSET, db: TuningDB | None = None):
        self.target, self.timer = target, timer or default_timer
        self.budget = tune_budget() if budget is _UNSET else budget
        self.db = db or TuningDB()
        self.timed = self.built = 0

    def key(self, signature: str, tensors: Sequence[Any], candidates: Sequence[GPUCandidate]
            ) -> tuple[str, dict]:
        """The database key (and its fields) of `signature` on tensors of these shapes and
        strides raced among `candidates` on this GPU."""
        bucket = [[*map(int, t.shape), *map(int, t.stride())] for t in tensors]
        fields = key_fields(signature, bucket, 1, candidates=[c.key for c in candidates],
                            generators=generators_digest(),
                            fingerprint=gpu_fingerprint(self.target))
        return key_of(fields), fields

    def choose(self, signature: str, tensors: Sequence[Any],
               candidates: Sequence[GPUCandidate], reference: Runner | None = None
               ) -> GPUChoice:
        """The database's winner, else (tuning) the fastest measured, else the first that
        builds; `UnsupportedError` naming each failure when none builds. `reference` computes
        the answers candidates are checked against (default: the extern on f32 copies)."""
        if not candidates:
            raise UnsupportedError(f"GPU tuner: no candidate for {signature}")
        key, fields = self.key(signature, tensors, candidates)
        tuning = self.budget is not None and len(candidates) > 1
        entry = None if tuning and retune() else self.db.lookup(key)
        failures: dict[str, str] = {}
        if entry is not None:
            for c in candidates:
                if c.key == entry["winner"] and (run := self._build(c, failures)):
                    return GPUChoice(c.key, run, "fastest when measured (tuning database)",
                                     {k: float(v) for k, v in entry["timings"].items()})
            log.info("tuning database winner %s unavailable for %s; choosing again",
                     entry["winner"], signature)
        if tuning:
            choice = self._tune(tensors, candidates, reference)
            if math.isfinite(choice.timings.get(choice.key, math.inf)):
                self.db.record(key, {**fields, "winner": choice.key, "failures": choice.failures,
                                     "timings": {k: v if math.isfinite(v) else "inf"
                                                 for k, v in choice.timings.items()}})
            return choice
        for c in candidates:
            if run := self._build(c, failures):
                return GPUChoice(c.key, run, "the cost model's first proposal (set "
                                 "TILEFOLD_TUNE=1 to measure)", failures=failures)
        raise UnsupportedError(f"GPU tuner: no candidate for {signature} builds: " +
                               "; ".join(f"{k}: {v}" for k, v in failures.items()))

    def _build(self, c: GPUCandidate, failures: dict[str, str]) -> Runner | None:
        self.built += 1
        try:
            return c.build()
        except Exception as exc:  # a failing config is passed over, not fatal
            failures[c.key] = f"build failed: {type(exc).__name__}: {exc}"
            log.info("GPU candidate %s: %s", c.key, failures[c.key])
            return None

    def _tune(self, tensors: Sequence[Any], candidates: Sequence[GPUCandidate],
              reference: Runner | None) -> GPUChoice:
        """Time the externs, then the others in order while the budget (compiles included)
        lasts."""
        start = time.perf_counter()
        order = sorted(candidates, key=lambda c: not c.extern)
        reduced = max(c.reduced for c in candidates)
        timings: dict[str, float] = {}
        failures: dict[str, str] = {}
        runs: dict[str, Runner] = {}
        want, exact = self._reference(tensors, candidates, reference)
        slowest = 0.0  # the longest build and first run so far
        for c in order:
            spent = time.perf_counter() - start
            if not c.extern and spent + slowest > self.budget:
                log.info("GPU tuning budget (%.0f s) spent before %s (%.1f s spent, a build "
                         "takes up to %.1f s)", self.budget, c.key, spent, slowest)
                break
            built = time.perf_counter()
            run = self._build(c, failures)
            timings[c.key] = math.inf
            if run is None:
                slowest = max(slowest, time.perf_counter() - built)
                continue
            try:
                outs = run(tensors)
                slowest = max(slowest, time.perf_counter() - built)
                if want is None:  # the extern's own answer is the reference
                    want = outs
                wrong = _mismatch(outs, want, reduced, exact)
                if wrong:
                    failures[c.key] = wrong
                    log.warning("GPU candidate %s: %s", c.key, wrong)
                    if strict() and not c.extern:
                        raise WrongAnswerError(f"GPU tuning: {c.key} {wrong} (strict mode "
                                               "refuses a wrong candidate)")
                    continue
                self.timed += 1
                timings[c.key] = self.timer(lambda run=run: run(tensors))
                runs[c.key] = run
            except WrongAnswerError:
                raise
            except Exception as exc:  # scored inf with its reason (Triton's autotuner habit)
                failures[c.key] = f"run failed: {type(exc).__name__}: {exc}"
                log.warning("GPU candidate %s: %s", c.key, failures[c.key])
        if not runs:
            raise UnsupportedError("GPU tuner: every candidate failed: " +
                                   "; ".join(f"{k}: {v}" for k, v in failures.items()))
        best = min(runs, key=timings.__getitem__)
        log.info("GPU tuning chose %s (%s)", best,
                 ", ".join(f"{k} {v:.3f} ms" for k, v in timings.items()))
        return GPUChoice(best, runs[best], "fastest when measured", timings, failures)

    def _reference(self, tensors: Sequence[Any], candidates: Sequence[GPUCandidate],
                   reference: Runner | None) -> tuple[list[Any] | None, bool]:
        """The answers to check against and whether they are exact (computed in f32 or
        wider, not rounded like the candidates'): `reference`, else the extern on f32 copies
        of the tensors, else (None) the extern's own outputs when it runs first."""
        if reference is not None:
            return list(reference(tensors)), True
        extern = next((c for c in candidates if c.extern), None)
        if extern is None:
            return None, False
        wide = [t.float() if getattr(t, "is_floating_point", lambda: False)()
                and t.element_size() < 4 else t for t in tensors]
        try:
            return [o.float() for o in extern.build()(wide)], True
        except Exception as exc:  # an extern that takes only its own dtypes (_scaled_mm)
            log.info("GPU tuner: the extern %s does not run on f32 copies (%s: %s); its own "
                     "answers are the reference", extern.key, type(exc).__name__, exc)
            return None, False


def _mismatch(outs: Sequence[Any], reference: Sequence[Any], reduced: int = 1,
              exact: bool = True) -> str | None:
    """Why `outs` differ from the `reference` outputs (None when they agree): each element
    within eps (|want| + mean |want|), eps = 4 u(its dtype) + (16 + 4 reduced) u(f32) (the
    rule of tests/tolerances.py with a second rounding of the result allowed; the mean
    magnitude stands for the size of the terms where a sum cancels), twice that when the
    reference was rounded as the candidates are (not `exact`)."""
    if len(outs) != len(reference):
        return f"wrong answer: {len(outs)} outputs, the reference gives {len(reference)}"
    for i, (got, want) in enumerate(zip(outs, reference, strict=True)):
        if tuple(got.shape) != tuple(want.shape):
            return f"wrong answer: output {i} is {list(got.shape)}, not {list(want.shape)}"
        if not want.numel():
            continue
        g, w = got.double(), want.double()
        u = ROUNDOFF.get(str(got.dtype).removeprefix("torch."), 2.0 ** -8)
        eps = (4 * u + (16 + 4 * reduced) * F32_ROUNDOFF) * (1 if exact else 2)
        err = (g - w).abs()
        bound = eps * (w.abs() + float(w.abs().mean()))
        if not bool((err <= bound).all()):  # NaN fails too
            worst = float(((err - bound) / w.abs().max().clamp_min(1e-30)).nan_to_num(1.0)
                          .max())
            return (f"wrong answer: output {i} differs from the reference beyond the "
                    f"{got.dtype} tolerance for sums of {reduced} (eps {eps:.1e}; worst "
                    f"excess {worst:.1e} of the largest magnitude)")
    return None


__all__ = ["EXTERN_ATTENTION", "EXTERN_GEMM", "GPUCandidate", "GPUChoice", "GPUTuner",
           "WrongAnswerError",
           "attention_candidates", "config_candidates", "config_key", "default_timer",
           "gemm_candidates", "generators_digest"]
