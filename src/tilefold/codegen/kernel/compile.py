"""Compile a memory-bound group for a target; call it on NumPy arrays with a few µs overhead.

Per call signature (shapes, strides, dtypes) a plan is made once: the layout (which picks or
compiles a kernel), the packed `params` array, the thread count and the output shapes. A call
is then one dict lookup, the output allocations and one ctypes call.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from tilefold.codegen.backend.base import Backend, get_backend
from tilefold.codegen.kernel.from_graph import (
    Group,
    Layout,
    analyze_group,
    contiguous_layout,
    element_strides,
    make_layout,
)
from tilefold.codegen.kernel.ir import Buffer, Kernel, param_layout
from tilefold.codegen.kernel.printer import print_kernel
from tilefold.codegen.kernel.schedule import Schedule, choose_schedule
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.ir import Block, Function, Value
from tilefold.ir.interpreter import bind_symbols
from tilefold.ir.types import SymDim
from tilefold.runtime import num_threads
from tilefold.runtime.buffers import aligned_empty
from tilefold.runtime.replay import NativeCall
from tilefold.target import Target, host_target


@dataclass
class _Compiled:
    kernel: Kernel
    schedule: Schedule
    cfunc: object
    multi: object = None  # the entry over a table of tensors (`emit._emit_multi`)


@dataclass
class _Plan:
    cfunc: object
    consts: tuple[int, ...]
    params: np.ndarray
    params_ptr: int
    outputs: tuple[tuple[tuple[int, ...], np.dtype], ...]
    nthreads: int
    copy_inputs: bool
    streaming: bool  # outputs past the last-level cache: stored around it, allocated aligned
    scratch: tuple[int, ...]  # elements of each scratch buffer, all threads' slices
    compiled: _Compiled | None = None
    const_arrays: tuple[np.ndarray, ...] = ()


def lower_group(group: Function | Block, target: Target | None = None) -> tuple[Kernel, Schedule]:
    """The kernel and schedule for `group` with row-major buffers (what `--print-ir` shows)."""
    return _row_major(analyze_group(group), target or host_target())


def _row_major(grp: Group, target: Target) -> tuple[Kernel, Schedule]:
    kernel = grp.kernel(contiguous_layout(grp))
    return kernel, choose_schedule(kernel, target).check(kernel)


class CompiledGroup:
    """A memory-bound group compiled for `target` by `backend` (a name in
    `codegen.backend`'s table); call it with the group's inputs."""

    def __init__(self, group: Function | Block, target: Target | None = None,
                 backend: str = "llvm", streaming: bool = True):
        self.target = target or host_target()
        # outputs past the last-level cache stored around it; off for a kernel whose outputs
        # are its inputs' memory (in place: the lines are in cache already, just read)
        self.streaming = streaming
        self.backend: Backend = get_backend(backend)
        self.group: Group = analyze_group(group)
        self.params: list[Value] = list(group.args)
        self._compiled: dict[tuple[Layout, bool], _Compiled] = {}
        self._plans: dict[tuple, _Plan] = {}

    def __call__(self, *arrays: np.ndarray, out: list[np.ndarray] | None = None
                 ) -> list[np.ndarray]:
        """The group's outputs for these inputs (checked against the signature first);
        `out` supplies C-contiguous output buffers (a buffer planner reusing memory)."""
        if not all(type(a) is np.ndarray for a in arrays):
            arrays = tuple(np.asarray(a) for a in arrays)
        plan = self.plan_of(arrays, out)
        if plan.copy_inputs:
            arrays = tuple(np.asarray(a, order="C") for a in arrays)
        if out is None:
            empty = aligned_empty if plan.streaming else np.empty
            outs = [empty(shape, dtype) for shape, dtype in plan.outputs]
        else:
            outs = list(out)
        scratch = [aligned_empty((n,), np.float32) for n in plan.scratch]  # per call: reentrant
        # ids of live arrays: the `.arrays` entry reads each one's data pointer
        plan.cfunc(*map(id, arrays), *plan.consts, *map(id, outs), *map(id, scratch),
                   plan.params_ptr, plan.nthreads)
        return outs

    def plan_of(self, arrays: tuple[np.ndarray, ...], out: list[np.ndarray] | None = None
                ) -> _Plan:
        """The plan for these inputs (made now if new), `out` checked against it."""
        plan = self._plans.get(tuple([(a.shape, a.strides, a.dtype) for a in arrays]))
        if plan is None:
            plan = self._plan(list(arrays))
        if out is not None and (len(out) != len(plan.outputs) or any(
            type(o) is not np.ndarray or (o.shape, o.dtype) != want
            or not o.flags.c_contiguous or not o.flags.writeable
            for o, want in zip(out, plan.outputs, strict=False)
        )):
            raise ShapeError(f"@{self.group.name}: out must be writable C-contiguous "
                             f"arrays of {[f'{d}{list(s)}' for s, d in plan.outputs]}")
        return plan

    def calls(self, *arrays: np.ndarray, out: list[np.ndarray]) -> list[NativeCall] | None:
        """The native call `self(*arrays, out=out)` makes, for replay (with scratch buffers of
        its own), or None where the call would copy its inputs first. Nothing runs."""
        plan = self.plan_of(arrays, out)
        if plan.copy_inputs:
            return None
        scratch = [aligned_empty((n,), np.float32) for n in plan.scratch]
        args = (*map(id, arrays), *plan.consts, *map(id, out), *map(id, scratch),
                plan.params_ptr, plan.nthreads)
        return [NativeCall(plan.cfunc, args, (*arrays, *out, plan.params), tuple(scratch))]

    def kernel_text(self, *arrays: np.ndarray) -> str:
        """The kernel IR and schedule that runs for these inputs (row-major when none)."""
        if not arrays:
            return print_kernel(*_row_major(self.group, self.target))
        self(*arrays)
        plan_key = tuple((a.shape, a.strides, a.dtype) for a in arrays)
        compiled = next(c for c in self._compiled.values()
                        if c.cfunc is self._plans[plan_key].cfunc)
        return print_kernel(compiled.kernel, compiled.schedule)

    def assembly(self) -> str:
        """The native code of the row-major kernel as the JIT compiles it (`explain --asm`)."""
        return self.backend.assembly(*_row_major(self.group, self.target), self.target)

    def _kernel(self, layout: Layout, streaming: bool = False) -> _Compiled:
        compiled = self._compiled.get((layout, streaming))
        if compiled is None:
            # A streamed output is not stashed into (softmax's exp stored, then reloaded): the
            # stash's store reads the line from memory first and the non-temporal final store
            # then evicts it (on the Xeon, softmax past L3 ran at 3.9 GB/s so, 1 thread). The
            # stash goes to a scratch row instead, which stays in L1 (znver3 softmax
            # 5120x2048, 1 thread: 6.5 GB/s recomputing exp -> 11.7); when the vector axis
            # is not the row's, exp is recomputed.
            kernel = self.group.kernel(layout, stash="scratch" if streaming else "output")
            schedule = choose_schedule(kernel, self.target).check(kernel)
            if any(b.scratch and kernel.stride(b.name, schedule.vector_axis) == 0
                   for b in kernel.buffers):
                kernel = self.group.kernel(layout, stash=None)
                schedule = choose_schedule(kernel, self.target).check(kernel)
            if streaming:
                schedule = dataclasses.replace(schedule, streaming_stores=True)
            reason = self.backend.supports(kernel, self.target)
            if reason is not None:
                raise UnsupportedError(f"@{self.group.name}: {reason}")
            executable = self.backend.compile(kernel, schedule, self.target)
            compiled = self._compiled[layout, streaming] = _Compiled(
                kernel, schedule, executable.entry, executable.multi)
        return compiled

    def _plan(self, arrays: list[np.ndarray]) -> _Plan:
        grp = self.group
        if len(arrays) != len(self.params):
            raise TypeError(f"@{grp.name} takes {len(self.params)} inputs, got {len(arrays)}")
        bindings = bind_symbols(_Signature(self.params, grp.name), arrays)
        sizes = {c: d if isinstance(d, int) else bindings[d.name] for c, d in grp.sizes.items()}
        copy = any(s % a.itemsize for a in arrays for s in a.strides)
        inputs = [np.asarray(a, order="C") if copy else a for a in arrays]  # 0-d stays 0-d
        consts = [spec.value for spec in grp.buffers if spec.value is not None]
        outputs = []
        for v in grp.outputs.values():
            shape = tuple(bindings[d.name] if isinstance(d, SymDim) else d for d in v.type.shape)
            outputs.append((shape, v.type.dtype.np_dtype))
        probes = inputs + consts + [np.empty(shape, dt) for shape, dt in outputs]
        strides = [element_strides(a) for a in probes]
        layout, axis_sizes, axis_strides = make_layout(grp, sizes, strides)
        out_bytes = sum(math.prod(shape) * np.dtype(dt).itemsize for shape, dt in outputs)
        streaming = self.streaming and out_bytes > self.target.l3_bytes > 0
        compiled = self._kernel(layout, streaming)
        kernel = compiled.kernel
        values = {("size", a.name): n for a, n in zip(kernel.axes, axis_sizes, strict=True)}
        rows = {b.name: _row(b, axis_sizes) for b in kernel.buffers if b.scratch}
        for b, st in zip(kernel.buffers, axis_strides + [s for s, _ in rows.values()],
                         strict=True):
            for a, s in zip(kernel.axes, st, strict=True):
                values[("stride", b.name, a.name)] = s
        for name, (_, slice_elements) in rows.items():
            values[("slice", name)] = slice_elements
        nthreads = self._threads(compiled.schedule, kernel, axis_sizes)
        params = np.array([values[e] for e in param_layout(kernel)] or [0], np.int64)
        plan = _Plan(compiled.cfunc, tuple(map(id, consts)), params,
                     params.ctypes.data, tuple(outputs), nthreads, copy, streaming,
                     tuple(nthreads * n for _, n in rows.values()), compiled, tuple(consts))
        self._plans[tuple([(a.shape, a.strides, a.dtype) for a in arrays])] = plan
        return plan

    def _threads(self, schedule: Schedule, kernel: Kernel, axis_sizes: list[int]) -> int:
        if schedule.parallel_axis is None or not self.target.is_host():
            return 1
        total = int(np.prod(axis_sizes))
        steps = axis_sizes[kernel.axis_index(schedule.parallel_axis)]
        if schedule.parallel_axis == schedule.vector_axis:
            steps //= schedule.vector_width * schedule.unroll
        return max(1, min(num_threads(), total // schedule.min_elements_per_thread, steps))


def _row(buffer: Buffer, axis_sizes: list[int]) -> tuple[list[int], int]:
    """A scratch buffer's strides (dense over the axes it varies along, 0 along the others)
    and the elements of one thread's slice: whole cache lines, so threads never share one."""
    strides, step = [], 1
    for n, s in zip(reversed(axis_sizes), reversed(buffer.strides), strict=True):
        strides.append(0 if s == 0 else step)
        step *= n if s != 0 else 1
    return strides[::-1], -(-step // 16) * 16


@dataclass
class _Signature:
    """What `bind_symbols` reads of a function: its parameters and name."""

    args: list[Value]
    name: str


def compile_group(group: Function | Block, target: Target | None = None,
                  backend: str = "llvm") -> CompiledGroup:
    """Compile a memory-bound group (elementwise, reduce, softmax, norms) for `target`."""
    return CompiledGroup(group, target, backend)
