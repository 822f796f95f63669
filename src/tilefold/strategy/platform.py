"""Where candidates run: a kind of target's arrays, answer check and timer, which the one
chooser (`select.decide`) races candidates with.

    cpu   NumPy arrays: random inputs, outputs the kernel fills; the extern's answers are the
          reference (`autotune.agrees`); interleaved medians with tilefold's pool beside each
          call; the cost model's first `TOP_K` and the extern are timed
    gpu   the torch tensors of the call that asked (`Context.arrays`), outputs the kernel
          returns; the extern run on f32 copies is the reference, at a tolerance by the
          output's dtype and the terms each output sums (`mismatch`); every candidate in the
          cost model's order while the budget lasts, compiles counted in it; a timer in
          milliseconds (`device_timer`: `do_bench`'s median, a `perf_counter` median under
          Triton's interpreter; a fake in tests)

`platform_for(target)` gives a target's platform; methods say which platforms they propose
for (`Method.platforms`), as JAX registers a lowering per platform.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from tilefold.runtime.thread_pool import thread_pool
from tilefold.strategy import autotune
from tilefold.strategy.problem import Problem, shape_bucket

# `method.Context`, `Kernel` and `Candidate` (method.py imports this module: named, not imported)
Context = Kernel = Candidate = Any

Timer = Callable[[Callable[[], Any]], float]  # milliseconds one call of fn takes
# unit roundoff of an output's dtype (the GPU's answer check, `mismatch`)
ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11,
            "bfloat16": 2.0 ** -8, "float8_e4m3fn": 2.0 ** -4}
F32_ROUNDOFF = 2.0 ** -24


class Platform:
    """How one kind of target runs, checks and times the candidates of a problem."""

    name: ClassVar[str]
    race: ClassVar[int | None]  # the cost model's first candidates timed (None: all, in order)
    builds_in_budget: ClassVar[bool]  # whether builds count against the tuning budget

    def fingerprint(self, ctx: Context) -> str | None:
        """The machine's id in tuning keys (None: the CPU's `hardware_fingerprint`)."""
        return None

    def bucket(self, problem: Problem, ctx: Context) -> list:
        """The shapes (and layouts) a tuning result stands for."""
        raise NotImplementedError

    def threads(self, ctx: Context) -> int:
        return 1

    def prepare(self, problem: Problem, ctx: Context, budget: float) -> None:
        """Work before candidates are timed (the CPU's first GEMM tunes its blocking)."""

    def inputs(self, problem: Problem, ctx: Context) -> list[Any]:
        """The arrays candidates are checked and timed on."""
        raise NotImplementedError

    def runner(self, kernel: Kernel, problem: Problem, inputs: Sequence[Any]
               ) -> Callable[[], list[Any]]:
        """A call of `kernel` on `inputs` returning its outputs (the one timed)."""
        raise NotImplementedError

    def reference(self, extern: Candidate | None, problem: Problem, inputs: Sequence[Any]
                  ) -> tuple[list[Any] | None, bool]:
        """The answers candidates must give and whether they are exact (None: the first
        candidate's own); raising skips tuning (the cost model's choice stands)."""
        raise NotImplementedError

    def mismatch(self, got: Sequence[Any], want: Sequence[Any], problem: Problem,
                 exact: bool) -> str | None:
        """Why `got` is not `want`'s answer, or None."""
        raise NotImplementedError

    def measure(self, runs: dict[str, Callable[[], Any]], budget: float) -> dict[str, float]:
        """Seconds per call of each run."""
        raise NotImplementedError


class CPUPlatform(Platform):
    name = "cpu"
    race = autotune.TOP_K
    builds_in_budget = False  # builds come from the disk cache or take ~0.1 s; time is timing

    def bucket(self, problem: Problem, ctx: Context) -> list:
        return [shape_bucket(s) for s in problem.shapes]

    def threads(self, ctx: Context) -> int:
        return ctx.threads

    def prepare(self, problem: Problem, ctx: Context, budget: float) -> None:
        if "matmul" in problem.names:
            autotune.tune_gemm_blocking_once(ctx.target, ctx.threads, budget)

    def inputs(self, problem: Problem, ctx: Context) -> list[Any]:
        return autotune.random_inputs(problem)

    def runner(self, kernel: Kernel, problem: Problem, inputs: Sequence[Any]
               ) -> Callable[[], list[Any]]:
        outs = autotune.empty_outputs(problem)  # once: no allocation in the timed call
        scratch = kernel.scratch_arrays()

        def run() -> list[Any]:
            kernel.run(*inputs, *outs, *scratch)
            return outs

        return run

    def reference(self, extern: Candidate | None, problem: Problem, inputs: Sequence[Any]
                  ) -> tuple[list[Any] | None, bool]:
        if extern is None:
            return None, False
        return self.runner(extern.build(), problem, inputs)(), True

    def mismatch(self, got: Sequence[Any], want: Sequence[Any], problem: Problem,
                 exact: bool) -> str | None:
        return None if autotune.agrees(list(got), list(want)) else \
            "wrong result against the extern reference"

    def measure(self, runs: dict[str, Callable[[], Any]], budget: float) -> dict[str, float]:
        pool = thread_pool()
        seconds = max(0.05 * len(runs), budget / 4)
        return autotune.measure(runs, seconds, pool.empty_region if pool.size > 1 else None)


class GPUPlatform(Platform):
    """A GPU's tensors and timer; `timer` (milliseconds a call) defaults to `device_timer`."""

    name = "gpu"
    race = None
    builds_in_budget = True  # a Triton compile takes seconds

    def __init__(self, timer: Timer | None = None):
        self.timer = timer or device_timer
        self._made: dict[tuple[int, Any], tuple[Any, Any]] = {}

    def made(self, op: Any, key: Any, make: Callable[[], Any]) -> Any:
        """What `make()` returns for `op` and `key`, made once: a method's Triton kernels for
        an op, which every call layout's candidates share (Triton compiles per layout inside
        them). A graph has a platform of its own, so these live as long as it."""
        if (id(op), key) not in self._made:
            self._made[id(op), key] = (op, make())  # op held: its id stays its own
        return self._made[id(op), key][1]

    def fingerprint(self, ctx: Context) -> str | None:
        from tilefold.target.gpu import gpu_fingerprint

        return gpu_fingerprint(ctx.target)

    def bucket(self, problem: Problem, ctx: Context) -> list:
        return [[*map(int, t.shape), *map(int, t.stride())] for t in ctx.arrays or ()]

    def inputs(self, problem: Problem, ctx: Context) -> list[Any]:
        return list(ctx.arrays or ())

    def runner(self, kernel: Kernel, problem: Problem, inputs: Sequence[Any]
               ) -> Callable[[], list[Any]]:
        return lambda: list(kernel.run(*inputs))

    def reference(self, extern: Candidate | None, problem: Problem, inputs: Sequence[Any]
                  ) -> tuple[list[Any] | None, bool]:
        """The extern on f32 copies of the inputs, else (None) the extern's own outputs when
        it runs first."""
        if extern is None:
            return None, False
        wide = [t.float() if getattr(t, "is_floating_point", lambda: False)()
                and t.element_size() < 4 else t for t in inputs]
        try:
            return [o.float() for o in extern.build().run(*wide)], True
        except Exception as exc:  # an extern that takes only its own dtypes (_scaled_mm)
            autotune.log.info("the extern %s does not run on f32 copies (%s: %s); its own "
                              "answers are the reference", extern.key, type(exc).__name__, exc)
            return None, False

    def mismatch(self, got: Sequence[Any], want: Sequence[Any], problem: Problem,
                 exact: bool) -> str | None:
        return mismatch(got, want, summed_terms(problem), exact)

    def measure(self, runs: dict[str, Callable[[], Any]], budget: float) -> dict[str, float]:
        return {key: self.timer(run) / 1e3 for key, run in runs.items()}


def platform_for(target: Any) -> Platform:
    """The platform of `target`: a GPU's for a `GPUTarget`, else the CPU's."""
    from tilefold.target.gpu import GPUTarget

    return GPUPlatform() if isinstance(target, GPUTarget) else CPUPlatform()


def device_timer(fn: Callable[[], Any], warmup: int = 10, rep: int = 40) -> float:
    """Milliseconds per call: `triton.testing.do_bench`'s median (over `rep` ms after `warmup`
    ms) on a GPU; under Triton's interpreter (no GPU), the median of three `perf_counter` runs
    after a warm-up."""
    from tilefold.codegen.triton.launch import interpreting

    if not interpreting():
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    fn()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return sorted(runs)[1]


def summed_terms(problem: Problem) -> int:
    """The most terms an output element of `problem` sums: a matmul's K, attention's keys
    plus the head dim, a reduction's reduced elements; 1 for elementwise groups."""
    most = 1
    for op in problem.body:
        if op.name == "matmul":
            a = problem.shape(op.operands[0])
            most = max(most, a[-2 if op.attr("transpose_a") else -1])
        elif op.name == "scaled_dot_product_attention":
            q, k = problem.shape(op.operands[0]), problem.shape(op.operands[1])
            most = max(most, k[-2] + q[-1])
        elif op.has_trait("reduction"):
            shape = problem.shape(op.operands[0])
            most = max(most, math.prod(shape[a] for a in op.reduced_axes()))
    return most


def mismatch(outs: Sequence[Any], reference: Sequence[Any], reduced: int = 1,
             exact: bool = True) -> str | None:
    """Why tensors `outs` differ from the `reference` outputs (None when they agree): each
    element within eps (|want| + mean |want|), eps = 4 u(its dtype) + (16 + 4 reduced) u(f32)
    (the rule of tests/tolerances.py with a second rounding of the result allowed; the mean
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
