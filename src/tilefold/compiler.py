"""`tilefold.compile`: a module in, a callable running fused native kernels out.

Per input-shape signature everything is decided once (kernels, buffers, argument lists), so a
call checks its inputs, allocates the outputs and makes one Python-level call per kernel.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tilefold.errors import ShapeError
from tilefold.ir import Function, Module, Value
from tilefold.ir.interpreter import bind_symbols
from tilefold.strategy import Decision, Problem, TuningDB, context, decide, tune_budget
from tilefold.strategy import register_builtin_methods as _register

PIPELINE = "default,fusion"


@dataclass
class Plan:
    """Everything one input signature needs: steps, preallocated intermediates, outputs."""

    steps: list[tuple]  # (run, argument slots)
    env: list  # slot -> array (constants and intermediates filled in, inputs per call)
    input_slots: list[int]
    output_slots: list[tuple[int, tuple, np.dtype]]  # fresh arrays per call
    results: list[int]
    decisions: list[Decision]


class CompiledGraph:
    """A compiled function: call it with NumPy arrays, get NumPy arrays back."""

    def __init__(self, module: Module, function: str, target, fusion_refusals: list):
        self.module = module
        self.function: Function = module[function]
        self.target = target
        self.refusals = fusion_refusals
        self.ctx = context(target)
        self._plans: dict[tuple, Plan] = {}
        self._lock = threading.Lock()
        self._slots: dict[Value, int] = {}
        for v in self.function.values():
            self._slots.setdefault(v, len(self._slots))

    def __call__(self, *args: np.ndarray):
        arrays = [np.asarray(a, order="C") for a in args]
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                bind_symbols(self.function, arrays)  # TilefoldError on a bad shape or dtype
                plan = self._plans[key] = self._plan([a.shape for a in arrays])
            env = plan.env
            for slot, a in zip(plan.input_slots, arrays, strict=True):
                env[slot] = a
            for slot, shape, dtype in plan.output_slots:
                env[slot] = np.empty(shape, dtype)
            for run, slots in plan.steps:
                run(*[env[s] for s in slots])
            results = [env[s] for s in plan.results]
            for slot, _, _ in plan.output_slots:
                env[slot] = None
        return results[0] if len(results) == 1 else tuple(results)

    def decisions(self, *shapes: Sequence[int]) -> list[Decision]:
        """What was chosen for each group at these input shapes (compiling them if needed)."""
        key = tuple((tuple(s), np.dtype(a.type.dtype.np_dtype).str)
                    for s, a in zip(shapes, self.function.args, strict=True))
        with self._lock:
            if key not in self._plans:
                self._plans[key] = self._plan([tuple(s) for s in shapes])
            return self._plans[key].decisions

    def _plan(self, shapes: list[tuple]) -> Plan:
        fn, slot = self.function, self._slots
        shape_of: dict[Value, tuple] = dict(zip(fn.args, shapes, strict=True))
        env: list = [None] * len(slot)
        steps, decisions = [], []
        db, budget = TuningDB(), tune_budget()
        ops = [op for op in fn.ops if op.name != "return"]
        last_use = {v: i for i, op in enumerate(ops) for v in op.operands}
        outputs = set(fn.outputs)
        free: dict[tuple, list[np.ndarray]] = {}
        fresh: list[tuple[int, tuple, np.dtype]] = []
        for i, op in enumerate(ops):
            if op.name == "constant":
                env[slot[op.result]] = op.attrs["value"]
                shape_of[op.result] = op.attrs["value"].shape
                continue
            problem = Problem.of(op, [shape_of[v] for v in op.operands])
            decision = decide(problem, self.ctx, db, budget)
            decisions.append(decision)
            for r, t in zip(op.results, problem.out_types(), strict=True):
                shape_of[r] = tuple(t.shape)
                dtype = np.dtype(t.dtype.np_dtype)
                if r in outputs:
                    fresh.append((slot[r], shape_of[r], dtype))
                else:
                    pool = free.get((shape_of[r], dtype.str))
                    env[slot[r]] = pool.pop() if pool else np.empty(shape_of[r], dtype)
            steps.append((decision.kernel.run, [slot[v] for v in (*op.operands, *op.results)]))
            for v in set(op.operands):
                if last_use.get(v) == i and v not in outputs and v.defining_op is not None \
                        and v.defining_op.name != "constant" and env[slot[v]] is not None:
                    free.setdefault((shape_of[v], env[slot[v]].dtype.str), []).append(
                        env[slot[v]])
        results = []
        for v in fn.outputs:
            if v.defining_op is None or v.defining_op.name == "constant":
                raise ShapeError("a compiled function must compute its results; it returns "
                                 f"%{v.name} unchanged (copy it in the graph)")
            results.append(slot[v])
        input_slots = [slot[a] for a in fn.args]
        return Plan(steps, env, input_slots, fresh, results, decisions)


def compile(module: Module, target=None, *, function: str = "main") -> CompiledGraph:
    """Optimize and fuse a copy of `module`, ready to run `function` on NumPy arrays.

    Kernels are chosen per input-shape signature on first call: from the tuning database, by
    measurement when `TILEFOLD_TUNE` is set, else by the cost model.
    """
    from tilefold.passes import PassManager

    _register()
    module = copy.deepcopy(module)
    manager = PassManager(PIPELINE)
    manager.run(module)
    refusals = [r for p in manager.passes for r in getattr(p, "refusals", [])]
    if function not in module.functions:
        raise ShapeError(f"module has no function @{function}")
    return CompiledGraph(module, function, target, refusals)
