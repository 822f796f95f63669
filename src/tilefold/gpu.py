"""`tilefold.compile(module, target="h200")`: the fused graph run on torch tensors of one GPU.

The same passes and fusion as the CPU path; then each op of the function runs as

    view op         a torch view (`tilefold.ir.ops.VIEWS`)
    constant        a tensor on the inputs' device, copied there once
    any other op    the kernel the one chooser (`strategy.select.decide`) picks among the
                    registered methods that propose for a GPU (`strategy/methods/gpu.py`:
                    Triton memory kernels, the GEMM and attention templates at their configs,
                    torch's library, the host reference that strict mode refuses), per input
                    layout on its first call: the tuning database's winner, under
                    TILEFOLD_TUNE the fastest measured on the GPU platform's timer, else the
                    cost model's first

At construction each op is asked which method will run it (the report's line, before any
call; strict mode refuses an op only the host can run); a template's config is chosen per
call layout. Under `TRITON_INTERPRET=1` the kernels run on CPU tensors, so whole graphs are
checked without a GPU (tests/gpu). Constants are copied to the inputs' device once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tilefold.errors import FallbackError, TilefoldError, strict_mode
from tilefold.ir import Module, Operation, Value
from tilefold.ir.ops import VIEWS  # layout ops as torch views
from tilefold.ir.types import SymDim
from tilefold.strategy import Context, Decision, Problem, TuningDB, context, decide, tune_budget
from tilefold.strategy.methods.gpu import to_device
from tilefold.strategy.platform import Timer
from tilefold.strategy.problem import bind_shapes
from tilefold.strategy.select import propose_all
from tilefold.target.gpu import GPUTarget

_UNSET: Any = object()


@dataclass
class _Step:
    """How one op of the function runs: `how` for the report, `run(tensors) -> tensors`."""

    op: Operation
    how: str
    run: Callable[[list[Any]], list[Any]]


@dataclass
class GPUGraph:
    """A compiled function for a GPU target: call it with torch tensors on one device (CPU ones
    under Triton's interpreter); it returns a list of tensors there, one per result.

    `timer` (milliseconds a call; default `do_bench`'s median), `budget` (seconds of tuning a
    problem; default `TILEFOLD_TUNE`'s, None: none) and `db` are the chooser's."""

    module: Module
    function: str
    target: GPUTarget
    strict: bool | None = None
    timer: Timer | None = None
    budget: Any = _UNSET
    db: TuningDB | None = None
    steps: list[_Step] = field(default_factory=list)
    _constants: dict[tuple[int, str], Any] = field(default_factory=dict)
    _device: Any = None
    _bindings: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ctx: Context = context(self.target, timer=self.timer)
        self.db = self.db or TuningDB()
        self.budget = tune_budget() if self.budget is _UNSET else self.budget
        with strict_mode(self.strict):
            fn = self.module[self.function]
            self.steps = [self._step(op) for op in fn.ops if op.name != "return"]

    def report(self) -> list[str]:
        """One line per op: how it runs on the GPU (`explain` for this target)."""
        return [f"%{s.op.results[0].name if s.op.results else '?'} = {s.op.name}: {s.how}"
                for s in self.steps]

    def decisions(self) -> list[Decision]:
        """Every kernel choice made so far (`strategy.Decision`, one per op and call layout),
        as the CPU's compiled graph gives them to `explain` and `tune`."""
        return [d for s in self.steps if isinstance(s.run, _Chosen) for d in s.run.chosen.values()]

    def __call__(self, *tensors: Any) -> list[Any]:
        fn = self.module[self.function]
        if len(tensors) != len(fn.args):
            raise TilefoldError(f"@{fn.name} takes {len(fn.args)} inputs, got {len(tensors)}")
        env: dict[Value, Any] = dict(zip(fn.args, tensors, strict=True))
        self._device = tensors[0].device if tensors else None
        self._bindings = bind_shapes(fn.args, [tuple(getattr(t, "shape", ())) for t in tensors])
        for step in self.steps:
            outs = step.run([env[v] for v in step.op.operands])
            env.update(zip(step.op.results, outs, strict=True))
        return [env[v] for v in fn.return_op.operands]

    def _step(self, op: Operation) -> _Step:
        if op.name in VIEWS:
            view, attrs = VIEWS[op.name], op.opdef.full_attrs(op.attrs)
            return _Step(op, "torch view", lambda xs: [view(xs[0], attrs)])
        if op.name == "constant":
            return _Step(op, "constant", lambda xs: [self._constant(op)])
        return _Chosen(self, op, self._planned(op)).step

    def _planned(self, op: Operation) -> str:
        """Which method will run `op` (its shapes' symbols taken as 1): the cost model's first
        proposal, or the host's with why the others refused; with none (strict mode refuses
        the host), `FallbackError`."""
        fn = self.module[self.function]
        ones = {d.name: 1 for v in fn.args for d in v.type.shape if isinstance(d, SymDim)}
        shapes = [tuple(d if isinstance(d, int) else 1 for d in v.type.shape)
                  for v in op.operands]
        problem = Problem.of(op, shapes, ones)
        candidates, rejections = propose_all(problem, self.ctx)
        reasons = "; ".join(f"{r.method}: {r.reason}" for r in rejections)
        if not candidates:
            raise FallbackError(f"no kernel method runs {problem.describe()} on "
                                f"{self.target.name} ({reasons})")
        first = candidates[0]
        return first.note + (f" ({reasons})" if first.method == "extern.host" else "")

    def _constant(self, op: Operation) -> Any:
        """`op`'s value as a tensor on the device of this call's inputs (copied there once)."""
        key = (id(op), str(self._device))
        if key not in self._constants:
            self._constants[key] = to_device(op.attrs["value"], self._device)
        return self._constants[key]


class _Chosen:
    """An op run by the kernel the chooser picks per input layout (shapes, strides, dtypes,
    device); `step` reports the choice once one is made."""

    def __init__(self, graph: GPUGraph, op: Operation, how: str):
        self.graph, self.op = graph, op
        self.chosen: dict[tuple, Decision] = {}
        self.step = _Step(op, how, self)

    def __call__(self, xs: list[Any]) -> list[Any]:
        key = tuple((tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device)) for x in xs)
        decision = self.chosen.get(key)
        if decision is None:
            graph = self.graph
            problem = Problem.of(self.op, [tuple(x.shape) for x in xs], graph._bindings)
            with strict_mode(graph.strict):
                decision = decide(problem, replace(graph.ctx, arrays=tuple(xs)), graph.db,
                                  graph.budget)
            self.chosen[key] = decision
            winner = decision.winner
            self.step.how = f"{winner.note} ({winner.key}: {decision.why})"
        return decision.kernel.run(*xs)
