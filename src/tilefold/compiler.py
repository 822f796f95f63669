"""`tilefold.compile`: a module in, a callable running fused native kernels out.

Per input-shape signature everything is decided once (kernels, buffers, argument lists), so a
call checks its inputs, allocates the outputs and makes one Python-level call per kernel.
Layout ops (reshape, transpose, slice, expand/squeeze, broadcast) are NumPy views, made once
at plan time over the planned buffers: they cost nothing per call. Kernels that read any
layout (`Kernel.strided`) get the views; others get a contiguous copy. A kernel that writes
any layout (`strided_out`) and whose result only feeds a transpose writes straight into the
transposed buffer, so e.g. attention's heads-to-hidden transpose and reshape are free.
A result donated to an argument (`donate`: a KV cache the caller wants written) that updates
that argument in place (`UPDATES`) is written into the argument's own array.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefold.codegen.llvm.cpu.copy import OUT_OF_RANGE, copy_call, scatter_call
from tilefold.errors import DTypeError, ShapeError, strict, strict_mode
from tilefold.ir import Function, Module, Operation, Value
from tilefold.ir.interpreter import bind_symbols
from tilefold.ir.ops import VIEWS  # layout ops as NumPy views
from tilefold.ir.ops.index import index_key, put
from tilefold.ir.types import SymDim
from tilefold.passes import PassManager
from tilefold.runtime.buffers import ALIGN
from tilefold.runtime.replay import NativeCall, Replay
from tilefold.strategy import Decision, Problem, TuningDB, context, decide, tune_budget
from tilefold.strategy import register_builtin_methods as _register
from tilefold.strategy.problem import bind_shapes
from tilefold.strategy.select import NATIVE_STEPS
from tilefold.target import Target, named_target
from tilefold.target.gpu import GPUTarget, gpu_target, gpu_target_names

PIPELINE = "integer-weights,default,merge-matmuls,dce,fusion,horizontal-fusion"
SAME_ORDER = frozenset({"reshape", "squeeze", "expand_dims"})  # views keeping C order
# `weights=` (else TILEFOLD_WEIGHTS): constant matmul weights stored as these codes.
WEIGHT_FORMATS = ("f32", "int8", "int4")


def _index_put(out: np.ndarray, values: np.ndarray, *indices: np.ndarray, attrs: dict) -> None:
    key = index_key("index_put", out.shape, attrs["axes"], list(indices))  # checks the range
    accumulate = attrs.get("accumulate", False)
    call = None if len(indices) != 1 or len(attrs["axes"]) != 1 else scatter_call(
        out, values, indices[0], attrs["axes"][0], accumulate, np.zeros(1, np.int64))
    if call is None:
        put(out, values, key, accumulate)
    else:
        call()


def _index_put_native(out: np.ndarray, values: np.ndarray, *indices: np.ndarray, attrs: dict
                      ) -> list[NativeCall] | None:
    """`_index_put` as a native scatter, for one index tensor along one axis (a KV cache's
    row write, an embedding's gradient); None otherwise."""
    if len(indices) != 1 or len(attrs["axes"]) != 1:
        return None
    return _one(scatter_call(out, values, indices[0], attrs["axes"][0],
                             attrs.get("accumulate", False), fixed=True))


def _one(call: NativeCall | None) -> list[NativeCall] | None:
    return None if call is None else [call]


# Ops whose result is operand 0 with some elements replaced: when operand 0's memory is free to
# overwrite (a donated argument or an intermediate, read by nothing later), the op writes just
# those elements there (`run(x_as_out, *other_operands, attrs=...)`), not a copy of x; its
# native form for replay, where it has one (`native(..., attrs=)`: the calls, or None).
UPDATES: dict[str, Callable[..., None]] = {"index_put": _index_put}
NATIVE_UPDATES: dict[str, Callable[..., list[NativeCall] | None]] = {
    "index_put": _index_put_native}

# Plans kept per compiled graph, by input shapes. Symbolic dims make a new plan per size (a
# growing KV cache: one per generated token; sentences of every length); each holds its
# intermediates, so only the most recently used are kept, up to MAX_PLANS of them holding at most
# PLAN_BYTES of buffers together (the newest always stays). A dropped plan is made again when
# its shapes come back, which costs more than a small call (MiniLM batches: ~6 ms, a call 17 ms):
# a count alone (8) re-planned every call of a workload cycling through a dozen sizes.
MAX_PLANS = 64
PLAN_BYTES = 256 << 20
# Kernel decisions kept per compiled graph, by op, operand shapes and the sizes of the symbolic
# dims the op names itself (an arange's length, a slice's start). Plans share them: a new
# decode length decides again only the ops whose sizes changed (the cache's concat and
# attention), not the layers' GEMMs.
MAX_DECISIONS = 4096


# How a step runs natively, for replay: `native(env)` returns its native calls on the env's
# arrays (None: the step needs Python).
Native = Callable[[list], list[NativeCall] | None]


class SharedBuffers:
    """Intermediate memory that the plans of several compiled graphs take turns using: graphs
    that never run at the same time (a training step's forward and backward graphs) share one
    pool and one lock, so a step holds about what the plan that needs most uses, not the sum.
    The pool is one arena of `limit` bytes, reserved (virtual memory) at its first use: each
    plan lays the buffers it needs (where its own free buffers, released after a last use,
    hold none that fits) one after the other from the arena's start, so every plan's buffers
    overlap every other's. Only the bytes some plan writes become resident (`held`). Past
    `limit`, plans allocate their own. (Chunks grown as plans asked had left a later plan's
    large buffer no room in them: GPT-2's 196 MB of logits taken beside 241 MB of chunks.)"""

    def __init__(self, limit: int = PLAN_BYTES):
        self.lock = threading.Lock()
        self.limit = limit
        self.arena: np.ndarray | None = None
        self.held = 0  # the furthest byte a plan uses

    @property
    def nbytes(self) -> int:
        """Bytes reserved (resident only where `held`)."""
        return 0 if self.arena is None else self.arena.nbytes

    def take(self, size: int, used: dict[int, int]) -> np.ndarray | None:
        """`size` raw bytes past the plan's earlier ones (`used[0]`: bytes the plan holds,
        updated; a new plan's is empty), 64-byte aligned; None past the limit."""
        size = -(-max(size, 1) // ALIGN) * ALIGN
        offset = used.get(0, 0)
        if offset + size > self.limit:
            return None
        if self.arena is None:
            self.arena = np.empty(self.limit, np.uint8)
        used[0] = offset + size
        self.held = max(self.held, offset + size)
        return self.arena[offset:offset + size]


@dataclass
class StepTimes:
    """Seconds spent per step label over the profiled calls of a compiled graph
    (`CompiledGraph.profiling`): kernels by method, ops and first operand's shape, copies and
    in-place updates."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    calls: int = 0

    def add(self, label: str, seconds: float) -> None:
        self.seconds[label] = self.seconds.get(label, 0.0) + seconds
        self.counts[label] = self.counts.get(label, 0) + 1

    def per_call(self) -> list[tuple[str, float, int]]:
        """(label, seconds per call, steps per call), the most time first."""
        calls = max(1, self.calls)
        return sorted(((label, s / calls, self.counts[label] // calls)
                       for label, s in self.seconds.items()), key=lambda row: -row[1])


@dataclass
class Plan:
    """Everything one input signature needs: steps, preallocated intermediates, outputs."""

    steps: list[tuple]  # (run, argument slots)
    natives: list[Native | None]  # per step: how it replays natively (None: Python only)
    views: list[tuple]  # (slot, slot of x, view, attrs): views of per-call arrays, made first
    env: list  # slot -> array (constants, intermediates and views filled in, inputs per call)
    input_slots: list[int]
    output_slots: list[tuple[int, tuple, np.dtype]]  # fresh arrays per call
    results: list[tuple[int, bool]]  # (slot, copy: a view, input or constant, not in place)
    decisions: list[Decision]
    layout: dict[str, str]  # layout op result -> "view" or "copy" (for explain)
    poisoned: bool = False  # strict: fresh buffers start as NaN (int max), never stale values
    nbytes: int = 0  # the buffers it holds (intermediates, copies)
    shared_bytes: int = 0  # those it uses of its graph's `SharedBuffers` (not in `nbytes`)
    replay: Recording | None = None  # the steps recorded for one set of input arrays
    last_inputs: tuple = ()  # weak references to the previous call's input arrays (two alike:
    # record them; an array new every call is not kept alive for it)
    labels: list[str] = field(default_factory=list)  # per step: what it runs (for profiles)
    fresh_views: frozenset = frozenset()  # result slots viewing a fresh output (made per call)
    # for `CompiledGraph.consume`: per step, the input slots (and views of them) it reads last;
    # per step, the fresh outputs it writes first
    drops: list[tuple[int, ...]] = field(default_factory=list)
    lazy: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def held(self) -> int:
        """Bytes of buffers this plan holds, its recording's included."""
        return self.nbytes + (self.replay.nbytes if self.replay is not None else 0)

    def execute(self, env: list, arrays: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                times: StepTimes | None = None) -> None:
        """Run the steps in Python on `env` (this plan's, or a recording's own copy); with
        `times`, each step timed into it (a step that replays natively as its native calls)."""
        for slot, a in zip(self.input_slots, arrays, strict=True):
            env[slot] = a
        for (slot, _, _), out in zip(self.output_slots, outputs, strict=True):
            env[slot] = out
        for slot, x, view, attrs in self.views:
            env[slot] = view(env[x], attrs)
        if times is None:
            for run, slots in self.steps:
                run(*[env[s] for s in slots])
            return
        for (run, slots), native, label in zip(self.steps, self.natives, self.labels,
                                               strict=True):
            calls = native(env) if native is not None else None
            started = time.perf_counter()
            if calls is None:
                run(*[env[s] for s in slots])
            else:  # what a replay runs, without the Python wrapper's own time
                for call in calls:
                    call()
            times.add(label, time.perf_counter() - started)
        times.calls += 1

    def results_of(self, env: list, copy_fresh: bool) -> list[np.ndarray]:
        fresh = {s for s, _, _ in self.output_slots} | self.fresh_views if copy_fresh else set()
        return [np.array(env[s]) if copied or s in fresh else env[s]
                for s, copied in self.results]


class Recording:
    """A plan's steps recorded on one set of input arrays: each run of consecutive native
    steps is one `Replay` (a single native call), the rest run in Python, all on an env of the
    recording's own (its output buffers are reused, so results are copied out)."""

    def __init__(self, plan: Plan, arrays: Sequence[np.ndarray]):
        self.inputs = tuple(arrays)
        self.env = list(plan.env)
        outputs = [np.empty(shape, dtype) for _, shape, dtype in plan.output_slots]
        self.nbytes = sum(o.nbytes for o in outputs)  # beyond the plan's (for its budget)
        plan.execute(self.env, arrays, outputs)  # makes the views; checks every step once
        self.results = plan.results_of(self.env, copy_fresh=True)
        self.segments: list[Callable[[], None]] = []
        pending: list[NativeCall] = []
        env = self.env
        for (run, slots), native in zip(plan.steps, plan.natives, strict=True):
            calls = native(self.env) if native is not None else None
            if calls is not None:
                pending += calls
                continue
            self._flush(pending)
            pending = []
            self.segments.append(lambda run=run, slots=slots: run(*[env[s] for s in slots]))
        self._flush(pending)
        self.native_steps = sum(1 for n in plan.natives if n is not None)
        self.plan = plan

    def _flush(self, calls: list[NativeCall]) -> None:
        if calls:
            self.segments.append(Replay(calls))

    def matches(self, arrays: Sequence[np.ndarray]) -> bool:
        return len(arrays) == len(self.inputs) and all(
            a is b for a, b in zip(arrays, self.inputs, strict=True))

    def __call__(self) -> list[np.ndarray]:
        for segment in self.segments:
            segment()
        if OUT_OF_RANGE[0]:  # a native gather or row write met an index out of range
            OUT_OF_RANGE[0] = 0
            raise ShapeError("an index of a gather or index_put is out of range for its axis "
                             "(negative indices count from the end); check the indices")
        return self.plan.results_of(self.env, copy_fresh=True)


def handed_over(call: Callable[..., Any], args: list) -> Any:
    """`call(*args)`, emptying `args` first: the plain form of a call that takes its inputs
    over (`CompiledGraph.consume`), for a callee that cannot let them go one by one."""
    given = list(args)
    args.clear()
    return call(*given)


def _let_go(plan: Plan) -> None:
    """Drop a call's arrays from `plan`'s env: the caller's inputs, views of them or of the
    fresh outputs, the outputs themselves: none is kept past the call."""
    env = plan.env
    for slot in plan.input_slots:
        env[slot] = None
    for slot, *_ in plan.views:
        env[slot] = None
    for slot, _, _ in plan.output_slots:
        env[slot] = None


def poison(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A buffer no correct kernel leaves as it is: NaN, or the integer type's largest value
    (strict mode allocates outputs and intermediates so, where `np.empty` could hand a kernel
    that never writes memory already holding the right answer)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc" or dtype.name == "bfloat16":
        return np.full(shape, np.nan, dtype)
    return np.full(shape, True if dtype.kind == "b" else _largest(dtype), dtype)


def _largest(dtype: np.dtype) -> int:
    """The integer dtype's largest value (ml_dtypes' int4 through its own iinfo: an array of
    that type means ml_dtypes is imported already)."""
    try:
        return int(np.iinfo(dtype).max)
    except ValueError:  # not one of NumPy's own
        import ml_dtypes

        return int(ml_dtypes.iinfo(dtype).max)


class CompiledGraph:
    """A compiled function: call it with NumPy arrays, get a list of NumPy arrays back (one per
    result of the function, even when there is one; each a fresh array the caller owns, except
    a `donate`d result written in place: that is the very argument array it updated)."""

    def __init__(
        self, module: Module, function: str, target: Target | None, fusion_refusals: list,
        strict: bool | None = None, donate: dict[int, int] | None = None, min_size: int = 1,
    ) -> None:
        self.module = module
        self.donate = dict(donate or {})  # result index -> argument index it may overwrite
        self.strict = strict  # None: TILEFOLD_STRICT decides when a plan is made
        self.function: Function = module[function]
        self.target = target
        self.refusals = fusion_refusals
        self.ctx = context(target, min_size=min_size)
        # Inputs that stay the same arrays from call to call are recorded on the second call and
        # replayed from then on (`Recording`); TILEFOLD_REPLAY=0 turns that off.
        self.replay = os.environ.get("TILEFOLD_REPLAY", "1") != "0" and (
            target is None or target.is_host())
        # Set to a StepTimes to time every step of every call into it (replay is then off).
        self.profiling: StepTimes | None = None
        # Results that are arguments come back as the caller's own arrays, not copies (set
        # before the first call: plans decide it); `GraphRunner.transient` turns it on.
        self.lend_inputs = False
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()  # most recently used last
        self._decided: OrderedDict[tuple, Decision] = OrderedDict()  # likewise
        self._symbols: dict[Operation, tuple[str, ...]] = {}
        self._lock = threading.Lock()
        self.shared: SharedBuffers | None = None  # `share`
        self._slots: dict[Value, int] = {}
        for v in self.function.values():
            self._slots.setdefault(v, len(self._slots))

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        arrays = [np.asarray(a, order="C") for a in args]
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                bind_symbols(self.function, arrays)  # TilefoldError on a bad shape or dtype
                plan = self._keep(key, self._plan([a.shape for a in arrays]))
            self._plans.move_to_end(key)
            times = self.profiling
            if times is None and plan.replay is not None and plan.replay.matches(arrays):
                return plan.replay()
            if times is None and self.replay and plan.last_inputs and all(
                    a is last() for a, last in zip(arrays, plan.last_inputs, strict=True)):
                plan.replay, plan.last_inputs = Recording(plan, arrays), ()
                return list(plan.replay.results)
            plan.last_inputs = tuple(map(weakref.ref, arrays)) if self.replay else ()
            fresh = poison if plan.poisoned else np.empty
            outputs = [fresh(shape, dtype) for _, shape, dtype in plan.output_slots]
            plan.execute(plan.env, arrays, outputs, times)
            results = plan.results_of(plan.env, copy_fresh=False)
            _let_go(plan)
        return results

    def consume(self, arrays: list) -> list[np.ndarray]:
        """`self(*arrays)`, taking the list's arrays over (it is emptied): each input is let
        go after the last step reading it, and each result allocated just before the step
        writing it, so the memory of inputs no one else holds serves the results (a training
        backward's saved activations, freed as it goes, its gradients). Never replayed."""
        if self.profiling is not None:
            return handed_over(self, arrays)
        arrays[:] = [np.asarray(a, order="C") for a in arrays]
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                bind_symbols(self.function, arrays)
                plan = self._keep(key, self._plan([a.shape for a in arrays]))
            self._plans.move_to_end(key)
            plan.last_inputs = ()
            env, fresh = plan.env, poison if plan.poisoned else np.empty
            try:
                for slot, a in zip(plan.input_slots, arrays, strict=True):
                    env[slot] = a
                arrays.clear()
                later = {o for outputs in plan.lazy.values() for o in outputs}
                for o, (slot, shape, dtype) in enumerate(plan.output_slots):
                    if o not in later:
                        env[slot] = fresh(shape, dtype)
                for slot, x, view, attrs in plan.views:
                    env[slot] = view(env[x], attrs)
                for i, (run, slots) in enumerate(plan.steps):
                    for o in plan.lazy.get(i, ()):
                        slot, shape, dtype = plan.output_slots[o]
                        env[slot] = fresh(shape, dtype)
                    run(*[env[s] for s in slots])
                    for s in plan.drops[i]:
                        env[s] = None
                return plan.results_of(env, copy_fresh=False)
            finally:
                _let_go(plan)

    def share(self, shared: SharedBuffers) -> None:
        """Take new plans' intermediate buffers from `shared` (and run under its lock): the
        caller promises that no other graph using it runs while this one does."""
        self.shared, self._lock = shared, shared.lock

    def decisions(self, *shapes: Sequence[int]) -> list[Decision]:
        """What was chosen for each group at these input shapes (compiling them if needed)."""
        return self.plan_for(*shapes).decisions

    def plan_for(self, *shapes: Sequence[int], reuse: bool = True) -> Plan:
        """The plan for these input shapes (made now if needed; under
        `strategy.select.native_steps()`, a plan of its own whose steps are native calls
        wherever a native method applies: an exported artifact's). `reuse=False`: one whose
        every intermediate and scratch has a buffer of its own (an export's, whose artifact
        shares memory by exact lifetimes instead: `aot/liveness.py`), made afresh and not
        kept (it runs once, and its buffers would crowd out the plans calls use)."""
        key = tuple((tuple(s), np.dtype(a.type.dtype.np_dtype).str)
                    for s, a in zip(shapes, self.function.args, strict=True))
        key += ("native",) if NATIVE_STEPS.get() else ()
        with self._lock:
            if not reuse:
                return self._plan([tuple(s) for s in shapes], reuse)
            if key not in self._plans:
                return self._keep(key, self._plan([tuple(s) for s in shapes]))
            return self._plans[key]

    def _keep(self, key: tuple, plan: Plan) -> Plan:
        """Cache `plan`, dropping the least recently used beyond `MAX_PLANS` plans or
        `PLAN_BYTES` of buffers (a plan holds its intermediates: one per decode length would
        grow without bound)."""
        self._plans[key] = plan
        held = sum(p.held for p in self._plans.values())
        while len(self._plans) > 1 and (len(self._plans) > MAX_PLANS or held > PLAN_BYTES):
            held -= self._plans.popitem(last=False)[1].held
        return plan

    def _plan(self, shapes: list[tuple], reuse: bool = True) -> Plan:
        """Planned twice where buffers are reused: once to learn every intermediate's size and
        lifetime, then with the offsets `place` gives them in one block."""
        with strict_mode(self.strict):
            if not reuse:
                return _Planner(self, shapes, reuse).plan()
            learn = _Planner(self, shapes, placement=None)
            learn.plan()
            offsets, total = place(learn.requests)
            sizes = [size for size, _, _ in learn.requests]
            return _Planner(self, shapes, placement=(offsets, total, sizes)).plan()

    def _decide(self, op: Operation, shapes: list[tuple], bindings: dict[str, int]) -> Decision:
        """The kernel for `op` at these operand shapes: the one an earlier plan chose, else
        chosen now (from the tuning database, by measurement or by the cost model)."""
        symbols = self._symbols.get(op)
        if symbols is None:
            symbols = self._symbols[op] = _named_symbols(op)
        key = (op, tuple(shapes), tuple(bindings[s] for s in symbols), NATIVE_STEPS.get())
        decision = self._decided.get(key)
        if decision is None:
            problem = Problem.of(op, shapes, bindings)
            decision = self._decided[key] = decide(problem, self.ctx, TuningDB(), tune_budget())
            while len(self._decided) > MAX_DECISIONS:
                self._decided.popitem(last=False)
        self._decided.move_to_end(key)
        return decision


def _named_symbols(op: Operation) -> tuple[str, ...]:
    """The symbols of every symbolic dim `op` (or the body of a fused `op`) names in an
    attribute or a type: with the operand shapes, their sizes fix the problem `op` poses."""
    ops = list(op.walk())
    dims = [d for o in ops for v in o.attrs.values() if isinstance(v, tuple) for d in v]
    dims += [d for o in ops for v in (*o.results, *(a for r in o.regions for a in r.args))
             for d in v.type.shape]
    return tuple(sorted({s for d in dims if isinstance(d, SymDim) for s in d.free}))


def place(requests: Sequence[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets in one block for buffers given as (bytes, first, last) with lifetimes [first,
    last) on one clock, so that two living at the same time never share a byte, and the bytes
    the block needs. Greedy by size (TFLite's and TVM's static planners do likewise): the
    largest first, each at the lowest offset clear of the placed ones it lives beside; offsets
    `ALIGN`-aligned. Buffers handed out in order from free lists (the planner's way until
    then) took MiniLM's training backward 35.3 MB where this takes 30.5."""
    offsets = [0] * len(requests)
    placed: list[tuple[int, int, int, int]] = []  # (start, end, first, last)
    for i in sorted(range(len(requests)), key=lambda i: (-requests[i][0], requests[i][1])):
        size, first, last = requests[i]
        size = -(-max(size, 1) // ALIGN) * ALIGN
        offset = 0
        for start, end in sorted((a, b) for a, b, f, t in placed if f < last and first < t):
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[i] = offset
        placed.append((offset, offset + size, first, last))
    return offsets, max((end for _, end, _, _ in placed), default=0)


class _Planner:
    """Builds one `Plan`: kernel decisions, buffers (sharing memory once dead), views.

    With `placement` None, it learns the intermediates it asks for, in order, as (bytes,
    first, last) on a clock of asks and releases (`requests`), all viewing one block (the plan
    is never run: heap memory of their own grew the process by the sum); with `placement`
    (`place`'s offsets and block size, and the asks' sizes), the same asks get those offsets
    in one block: the graph's shared pool, else its own. `reuse=False` gives every buffer
    memory of its own (an export's plan)."""

    def __init__(self, graph: CompiledGraph, shapes: list[tuple], reuse: bool = True,
                 placement: tuple[list[int], int, list[int]] | None = None):
        self.graph = graph
        self.reuse = reuse  # False: no buffer of an earlier step, none of `SharedBuffers`
        self.placement = placement
        self.requests: list[list[int]] = []  # [bytes, first, last] of each buffer asked for
        self.clock = 0
        self.asked: dict[int, int] = {}  # id of a buffer handed out -> its request
        self.block: np.ndarray | None = None
        fn = self.fn = graph.function
        self.slot = dict(graph._slots)
        self.env: list = [None] * len(self.slot)
        self.bindings = bind_shapes(fn.args, shapes)
        self.steps: list[tuple] = []
        self.natives: list[Native | None] = []
        self.labels: list[str] = []
        self.views: list[tuple] = []
        self.layout: dict[str, str] = {}
        self.fresh: list[tuple[int, tuple, np.dtype]] = []
        self.owned: dict[Value, np.ndarray] = {}  # planned intermediate -> its (base) buffer
        # a reshape's copies, by the value owning the memory they were copied from: freed
        # with it (a copy and its own views share that value's last use)
        self.copies: dict[Value, list[np.ndarray]] = {}
        self.per_call: set[Value] = set(fn.args)  # values whose arrays change every call
        self.alloc = poison if strict(graph.strict) else np.empty
        self.nbytes = 0  # of the buffers allocated for this plan
        self.used: dict[int, int] = {}  # shared pool chunk -> bytes of it this plan holds
        self.shared_bytes = 0
        for a, shape in zip(fn.args, shapes, strict=True):  # probes: views learn layouts
            self.env[self.slot[a]] = np.empty(shape, a.type.dtype.np_dtype)
        self.ops = [op for op in fn.ops if op.name != "return"]
        self.root: dict[Value, Value] = {}  # a view -> the value owning its memory
        reordered: set[Value] = set()  # views through an op that reorders elements
        for op in self.ops:
            if op.name in VIEWS:
                x = op.operands[0]
                self.root[op.results[0]] = self.root.get(x, x)
                if x in reordered or op.name not in SAME_ORDER:
                    reordered.add(op.results[0])
        self.outputs = set(fn.outputs)
        # kernel results that one output views and none returns otherwise (a saved
        # activation's reshape): written into a fresh array per call like an output, so the
        # view is returned as it is (results never share memory), not copied out of a buffer
        # (only through views that keep the elements' order: a transposed one is better
        # made contiguous by the kernel's own choice of layout, copied out as below)
        roots = [self.root.get(v, v) for v in fn.outputs]
        self.viewed = {r for v, r in zip(fn.outputs, roots, strict=True)
                       if v is not r and roots.count(r) == 1 and v not in reordered} \
            - set(fn.args)
        # the other outputs viewing an intermediate's memory (a transposed saved activation):
        # copied into their fresh array where they are defined (the slot, once planned), so
        # the buffer they view goes back to the pool at its last use, not at the graph's end
        once = {v for v in fn.outputs if fn.outputs.count(v) == 1}
        self.copied_out: dict[Value, int | None] = {
            v: None for v, r in zip(fn.outputs, roots, strict=True)
            if v is not r and v in once and r not in self.viewed and r not in fn.args}
        self._hoist(self.copied_out)
        self.last_use = {self.root.get(v, v): i for i, op in enumerate(self.ops)
                         for v in op.operands}
        for v, r in zip(fn.outputs, roots, strict=True):
            if v not in self.copied_out:
                self.last_use[r] = len(self.ops)
        self.users = fn.uses()
        self.donated = {fn.outputs[r]: fn.args[a] for r, a in graph.donate.items()}
        self.in_place: set[Value] = set()
        self.in_place_args: set[Value] = set()  # arguments a kernel result is written over

    def _hoist(self, outputs: Iterable[Value]) -> None:
        """Move the views making `outputs` to right after the op defining the memory they
        view (a graph lists them last, before it returns): each output is copied out as soon
        as it exists, and its buffer is free for reuse after the last kernel reading it."""
        chain: set[Operation] = set()
        for v in outputs:
            while v in self.root:
                chain.add(v.defining_op)
                v = v.defining_op.operands[0]
        after: dict[Value, list[Operation]] = {}
        for op in self.ops:
            if op in chain:
                after.setdefault(op.operands[0], []).append(op)
        ordered: list[Operation] = []

        def place(op: Operation) -> None:
            ordered.append(op)
            for view in (view for r in op.results for view in after.get(r, ())):
                place(view)

        for op in self.ops:
            if op not in chain:
                place(op)
        self.ops = ordered

    def plan(self) -> Plan:
        decisions = []
        for i, op in enumerate(self.ops):
            if op.name == "constant":
                self.env[self.slot[op.results[0]]] = op.attrs["value"]
            elif op.name in VIEWS:
                self._view(op)
                if op.results[0] in self.copied_out:
                    self._copy_out(op.results[0])
            elif op.name in UPDATES and self._overwritable(op, i):
                self._update(op)
            else:
                decisions.append(self._kernel(op, i))
            self._release(op, i)
        fresh = {s for s, _, _ in self.fresh}
        fresh_values = {v for v in self.per_call if self.slot[v] in fresh}
        views = {self.slot[v] for v in self.fn.outputs  # per-call views of fresh arrays
                 if v in self.per_call and self.root.get(v) in fresh_values & self.viewed}
        lent = set(self.fn.args) if self.graph.lend_inputs else set()
        results = [(out, False) if (out := self.copied_out.get(v)) is not None else
                   (self.slot[v], self.slot[v] not in fresh | views and v not in self.in_place
                    and v not in lent) for v in self.fn.outputs]
        for v in self.per_call:  # drop the probes
            self.env[self.slot[v]] = None
        return Plan(self.steps, self.natives, self.views, self.env,
                    [self.slot[a] for a in self.fn.args], self.fresh, results, decisions,
                    self.layout, self.alloc is poison, self.nbytes, labels=self.labels,
                    shared_bytes=self.shared_bytes, fresh_views=frozenset(views),
                    **self._lifetimes({s for s, _ in results}))

    def _lifetimes(self, kept: set[int]) -> dict[str, Any]:
        """For a consuming call (`CompiledGraph.consume`): the input slots and the views made
        of them up front, each let go after the last step reading it (but those the results
        are), and each fresh output allocated just before the step writing it first (but
        those a view made up front reads)."""
        last: dict[int, int] = {}
        first: dict[int, int] = {}
        for i, (_, slots) in enumerate(self.steps):
            for s in slots:
                last[s] = i
                first.setdefault(s, i)
        if not self.steps:
            return {}
        derived = {self.slot[a] for a in self.fn.args}
        for slot, x, _, _ in self.views:  # in order: a view's source comes before it
            if x in derived:
                derived.add(slot)
        drops: list[list[int]] = [[] for _ in self.steps]
        for s in derived - kept:
            drops[last.get(s, 0)].append(s)
        viewed = {x for _, x, _, _ in self.views}
        lazy: dict[int, list[int]] = {}
        for o, (s, _, _) in enumerate(self.fresh):
            if s not in viewed and s in first:
                lazy.setdefault(first[s], []).append(o)
        return {"drops": [tuple(d) for d in drops],
                "lazy": {i: tuple(os) for i, os in lazy.items()}}

    def _step(self, run: Callable[..., None], slots: list[int], native: Native | None,
              label: str) -> None:
        self.steps.append((run, slots))
        self.natives.append(native)
        self.labels.append(label)

    def _copy_step(self, dst: int, src: int) -> None:
        """A step copying slot `src`'s array into slot `dst`'s (np.copyto; natively a copy)."""
        self._step(np.copyto, [dst, src], lambda env: _one(copy_call(env[dst], env[src])),
                   "copy")

    def _attrs(self, op: Operation) -> dict:
        def size(d):
            return self.bindings[d.name] if isinstance(d, SymDim) else d

        return {k: tuple(map(size, v)) if isinstance(v, tuple) else v
                for k, v in op.opdef.full_attrs(op.attrs).items()}

    def _view(self, op: Operation) -> None:
        (x,), (y,) = op.operands, op.results
        view, attrs, env, slot = VIEWS[op.name], self._attrs(op), self.env, self.slot
        out = view(env[slot[x]], attrs)
        self.layout[y.name] = "view"
        copied = out.size and not np.may_share_memory(out, env[slot[x]])  # a reshape's copy
        if x in self.per_call and not copied:  # made again from each call's array, up front
            self.per_call.add(y)
            self.views.append((slot[y], slot[x], view, attrs))
        elif copied and y in self.copied_out:  # an output: copied into its fresh array
            del self.copied_out[y]
            self.fresh.append((slot[y], out.shape, out.dtype))
            self.per_call.add(y)
            dst = self._const_slot(None)  # per call: that array seen in the source's shape
            self.views.append((dst, slot[y], VIEWS["reshape"], {"shape": env[slot[x]].shape}))
            self._copy_step(dst, slot[x])
            out = np.empty(out.shape, out.dtype)  # a probe, like a fresh kernel result's
            self.layout[y.name] = "copy"
        elif copied:  # into a buffer of its own, in order (per-call arrays are C-ordered)
            base = self._buffer(out.shape, out.dtype)  # reused once its source is dead
            self.copies.setdefault(self.root.get(x, x), []).append(base)
            self._copy_step(self._const_slot(base.reshape(env[slot[x]].shape)), slot[x])
            out = base
            self.layout[y.name] = "copy"
        env[slot[y]] = out

    def _copy_out(self, v: Value) -> None:
        """Copy output `v`, a view of an intermediate's buffer, into its fresh array now."""
        if v in self.per_call:  # a view of an argument or of a fresh result: no buffer
            del self.copied_out[v]
            return
        array = self.env[self.slot[v]]
        out = self.copied_out[v] = self._const_slot(np.empty(array.shape, array.dtype))
        self.fresh.append((out, array.shape, array.dtype))
        self._copy_step(out, self.slot[v])

    def _overwritable(self, op: Operation, i: int) -> bool:
        """Whether `op` may write its result over operand 0's memory: nothing reads that later,
        and it is an intermediate buffer, or the argument the result is donated to."""
        x, (r,) = op.operands[0], op.results
        if x in op.operands[1:] or self.root.get(x, x) is not x or self.last_use.get(x) != i:
            return False
        return self.donated.get(r) is x if r in self.outputs else x in self.owned

    def _update(self, op: Operation) -> None:
        """`op` writes the elements it replaces into operand 0's array, which becomes its result."""
        (x, *rest), (r,) = op.operands, op.results
        slot = self.slot
        if x in self.per_call:  # the donated argument: its array is the call's
            slot[r] = slot[x]
            self.per_call.add(r)
            self.in_place.add(r)
        else:
            self.owned[r] = self.owned.pop(x)
            self.env[slot[r]] = self.env[slot[x]]
        self.layout[r.name] = "in place"
        update, attrs = UPDATES[op.name], self._attrs(op)
        slots = [slot[x], *(slot[v] for v in rest)]
        native = NATIVE_UPDATES.get(op.name)
        self._step(lambda *arrays: update(*arrays, attrs=attrs), slots,
                   None if native is None else
                   lambda env: native(*[env[s] for s in slots], attrs=attrs),
                   f"{op.name} (in place)")

    def _const_slot(self, array: np.ndarray) -> int:
        self.env.append(array)
        return len(self.env) - 1

    def _written_over(self, op: Operation, i: int, r: Value) -> Value | None:
        """The donated argument an in-place kernel's result `r` may be written over: an
        operand of `op` of `r`'s shape, C-contiguous, read by nothing after `op`."""
        x = self.donated.get(r)
        if x is None or x not in op.operands or self.root.get(x, x) is not x or \
                self.last_use.get(x) != i or x in self.in_place_args:
            return None
        array = self.env[self.slot[x]]
        if array.shape != tuple(self._shape_of(r)) or not array.flags.c_contiguous:
            return None
        return x

    def _shape_of(self, r: Value) -> tuple:
        return tuple(self.bindings[d.name] if isinstance(d, SymDim) else d
                     for d in r.type.shape)

    def _kernel(self, op: Operation, i: int) -> Decision:
        env, slot = self.env, self.slot
        decision = self.graph._decide(op, [env[slot[v]].shape for v in op.operands],
                                      self.bindings)
        problem, kernel = decision.problem, decision.kernel
        copies: list[np.ndarray] = []  # C-ordered copies of strided operands, for this step
        args = [slot[v] if kernel.strided or env[slot[v]].flags.c_contiguous
                else self._contiguous(v, copies) for v in op.operands]
        for r, t in zip(op.results, problem.out_types(), strict=True):
            shape, dtype = tuple(t.shape), np.dtype(t.dtype.np_dtype)
            x = self._written_over(op, i, r) if kernel.in_place else None
            if x is not None:  # the caller's own array: an optimizer's parameter, in place
                slot[r] = slot[x]
                self.per_call.add(r)
                self.in_place.add(r)
                self.in_place_args.add(x)
                self.layout[r.name] = "in place"
                args.append(slot[x])
                continue
            args.append(slot[r])
            if r in self.outputs or r in self.viewed:
                self.fresh.append((slot[r], shape, dtype))
                self.per_call.add(r)
                env[slot[r]] = np.empty(shape, dtype)  # a probe, like the inputs'
                continue
            perm = self._transposed_by_user(r) if kernel.strided_out else None
            stored = shape if perm is None else tuple(shape[p] for p in perm)
            base = self.owned[r] = self._buffer(stored, dtype)
            env[slot[r]] = base if perm is None else base.transpose(np.argsort(perm))
        scratch = [self._buffer(tuple(shape), np.dtype(dtype)) for shape, dtype in kernel.scratch]
        for buffer in scratch:
            args.append(self._const_slot(buffer))
        for buffer in scratch + copies:  # free again once this step is planned: later steps
            self._give_back(buffer)  # reuse them (not its results: those were laid first)
        calls = kernel.calls
        method = decision.winner.method if decision.winner is not None else "?"
        self._step(kernel.run, args, None if calls is None else
                   lambda env: calls(*[env[s] for s in args]),
                   f"{method}: {' -> '.join(problem.names)} {list(env[args[0]].shape)}")
        return decision

    def _buffer(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """Raw bytes viewed as `shape`/`dtype`: at the placement's offset for this ask, or
        memory of its own (learning the asks, or without reuse)."""
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = None
        if self.reuse:
            ask = len(self.requests)
            self.clock += 1
            self.requests.append([size, self.clock, sys.maxsize])
            if self.placement is not None:
                raw = self._placed(ask, size)
            else:  # learning: every ask views one block (never run, never written)
                if self.block is None or self.block.nbytes < size:
                    self.block = np.empty(max(size, 1), np.uint8)
                raw = self.block[:size]
        if raw is None:
            raw = np.empty(max(size, 1), np.uint8)
            self.nbytes += raw.nbytes
        buffer = raw[:size].view(dtype).reshape(shape)
        if self.alloc is not np.empty and (self.placement is not None or not self.reuse):
            buffer[...] = self.alloc(shape, dtype)  # strict mode's poison (not while learning)
        if self.reuse:
            self.asked[id(buffer)] = ask
        return buffer

    def _placed(self, ask: int, size: int) -> np.ndarray:
        """Ask number `ask`'s bytes in the block, which is taken at the first ask."""
        offsets, total, sizes = self.placement
        if ask >= len(offsets) or sizes[ask] != size:
            raise RuntimeError(f"@{self.fn.name}: the plan asked for other buffers than when "
                               "its placement was learnt (a planner bug)")
        if self.block is None:
            shared = self.graph.shared
            self.block = None if shared is None else shared.take(total, self.used)
            if self.block is not None:
                self.shared_bytes += self.block.nbytes
            else:
                self.block = np.empty(max(total, 1), np.uint8)
                self.nbytes += self.block.nbytes
        return self.block[offsets[ask]:offsets[ask] + size]

    def _give_back(self, buffer: np.ndarray) -> None:
        """`buffer` is dead from here on: its bytes may serve a later ask."""
        if self.reuse:
            self.clock += 1
            self.requests[self.asked[id(buffer)]][2] = self.clock

    def _contiguous(self, v: Value, copies: list[np.ndarray]) -> int:
        """A slot holding a C-contiguous copy of `v`, refreshed by a step before each use, in
        a buffer the step's kernel alone reads (added to `copies`, given back after it)."""
        array = self.env[self.slot[v]]
        buffer = self._buffer(array.shape, array.dtype)
        copies.append(buffer)
        copy_slot = self._const_slot(buffer)
        self._copy_step(copy_slot, self.slot[v])
        return copy_slot

    def _transposed_by_user(self, r: Value) -> tuple[int, ...] | None:
        """The perm of `r`'s only user when that is a last-axis-keeping transpose."""
        users = self.users.get(r, [])
        if len(users) != 1 or users[0].name != "transpose":
            return None
        perm = tuple(users[0].attr("perm"))
        return perm if perm and perm[-1] == len(perm) - 1 else None

    def _release(self, op: Operation, i: int) -> None:
        """Return buffers whose last use was `op` to the pool."""
        for v in set(op.operands):
            root = self.root.get(v, v)
            if self.last_use.get(root) != i:
                continue
            bases = self.copies.pop(root, [])
            if root in self.owned:
                bases.append(self.owned.pop(root))
            for base in bases:
                self._give_back(base)


def pipeline(weights: str | None = None) -> str:
    """The compile pipeline; `weights` "int8" or "int4" quantizes constant matmul weights
    (weight-only: `passes/quantize_weights.py`); None reads TILEFOLD_WEIGHTS (default f32)."""
    weights = weights or os.environ.get("TILEFOLD_WEIGHTS") or "f32"
    if weights not in WEIGHT_FORMATS:
        raise DTypeError(f"weights={weights!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    if weights == "f32":
        return PIPELINE
    return PIPELINE.replace("dce,", f"quantize-weights{{format={weights}}},dce,", 1)


def optimized(module: Module, function: str = "main", weights: str | None = None,
              in_place: bool = False, horizontal: bool = True) -> tuple[Module, list]:
    """A copy of `module` (its constant arrays shared), or `module` itself with `in_place`,
    through the pipeline, and the fusion refusals; `horizontal=False` leaves out
    horizontal fusion (a GPU runs no multi-tensor kernel yet)."""
    if not in_place:  # constant arrays (weights) are never written by passes: shared
        shared = {id(v): v for op in module.walk() for v in op.attrs.values()
                  if isinstance(v, np.ndarray)}
        module = copy.deepcopy(module, memo=shared)
    passes = pipeline(weights)
    manager = PassManager(passes if horizontal else passes.replace(",horizontal-fusion", ""),
                          verify_each=False)
    manager.run(module)
    refusals = [r for p in manager.passes for r in getattr(p, "refusals", [])]
    if function not in module.functions:
        raise ShapeError(f"module has no function @{function}")
    return module, refusals


def compile(
    module: Module, target: Target | GPUTarget | str | None = None, *, function: str = "main",
    strict: bool | None = None, donate: dict[int, int] | None = None,
    weights: str | None = None, in_place: bool = False, min_size: int = 1, passes: bool = True,
) -> CompiledGraph:
    """Optimize and fuse a copy of `module`, ready to run `function` on NumPy arrays (for a GPU
    target, named as "h200" or a `GPUTarget`: on torch tensors of that device, `tilefold.gpu`).

    Kernels are chosen per input-shape signature on first call: from the tuning database, by
    measurement when `TILEFOLD_TUNE` is set, else by the cost model. The compiled graph returns
    a list with one array per function result. `strict=True` makes a kernel method's failure,
    or an extern kernel running the reference implementation, a `FallbackError` instead of a
    quiet switch to another method; None (the default) follows `TILEFOLD_STRICT`.
    `donate={result: argument}` allows writing that result into that argument's array (the
    caller's state, such as a KV cache, updated in place); the call then returns that array.
    `weights="int8"` or `"int4"` stores constant matmul weights quantized (weight-only, decoded
    in the GEMM's registers: a quarter or an eighth of the bytes a decode step reads); None
    follows `TILEFOLD_WEIGHTS` (unset: f32, exact). `in_place=True` optimizes `module` itself
    instead of a copy (for a caller that built it only to compile it; it is changed).
    `min_size` is the least size any symbolic dim takes (Dynamo specializes sizes 0 and 1, so
    its graphs give 2): kernels that trade memory for time read it (a GEMM whose symbolic rows
    are never one holds its constant weight packed); no answer depends on it.
    `passes=False` compiles `module` as it is, for a module that went through `optimized`
    (this pipeline, these `weights`) already, printed and parsed back (a stored graph); it
    reports no fusion refusals.
    """
    if isinstance(target, str):
        target = gpu_target(target) if target in gpu_target_names() else named_target(target)
    _register()
    if passes:
        module, refusals = optimized(module, function, weights, in_place,
                                     horizontal=not isinstance(target, GPUTarget))
    elif function not in module.functions:
        raise ShapeError(f"module has no function @{function}")
    else:
        refusals = []
    if isinstance(target, GPUTarget):
        from tilefold.gpu import GPUGraph  # on first use: it needs torch and Triton

        return GPUGraph(module, function, target, strict)
    return CompiledGraph(module, function, target, refusals, strict, donate, min_size)
