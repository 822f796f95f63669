"""How a kernel runs, kept apart from what it computes: vector axis and width, unrolling,
threads. `choose_schedule` derives one from a kernel's strides and the target."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tilefold.codegen.kernel.ir import Kernel, Load, Loop, Store, walk_expr
from tilefold.errors import TilefoldError
from tilefold.target import Target

MIN_ELEMENTS_PER_THREAD = 32768  # below this a parallel region costs more than it saves
PREFETCH_ROWS = 2  # how many rows ahead a multi-sweep row kernel prefetches (see Schedule)


@dataclass(frozen=True)
class Schedule:
    """vector_axis runs `vector_width` lanes at a time, `unroll` vectors per step (so as many
    independent accumulators for reductions along it), and a masked tail: loads and stores
    never touch memory past the axis' end. Reductions along the vector axis combine lanes at
    the end (horizontal); loops nested inside it accumulate whole vectors (vertical).
    parallel_axis (the outermost loop's first axis) is split in contiguous blocks over threads
    when a call has at least `min_elements_per_thread` elements per thread. With
    `streaming_stores`, the final full vector stores to outputs (`final_stores`) bypass the
    caches (non-temporal, where the address is vector-aligned): outputs larger than the
    last-level cache would only evict the inputs, and each cached store first reads its line
    from memory. With `prefetch_axis` (a multi-sweep row kernel: reductions, then a pass that
    reuses the row), the sweep before the last over each row prefetches, once per cache line,
    what the step `PREFETCH_ROWS` on along that axis loads: the first sweep fetches the row
    from memory, the later ones compute on it in L1 while nothing would stream, and the
    prefetch keeps memory busy meanwhile. Zen 1, prefetching one row ahead in the last sweep:
    layer_norm and rms_norm 1.2-1.3x on 10 MiB. Xeon (AVX-512), 512 MiB read from DRAM, 1
    thread, against the last sweep one row ahead: rms_norm 12.3 -> 15.5 GB/s, layer_norm 11.6
    -> 14.7, softmax 8.6 -> 11.3 (from its max sweep, too quick to hide a row's fetch, 8.7)."""

    vector_axis: str | None
    vector_width: int = 1
    unroll: int = 1
    parallel_axis: str | None = None
    min_elements_per_thread: int = MIN_ELEMENTS_PER_THREAD
    streaming_stores: bool = False
    prefetch_axis: str | None = None

    def __str__(self) -> str:
        parts = []
        if self.vector_axis is not None:
            parts.append(f"vector {self.vector_axis} x{self.vector_width} masked-tail")
            parts.append(f"unroll {self.unroll}")
        if self.parallel_axis is not None:
            parts.append(f"parallel {self.parallel_axis} (>= {self.min_elements_per_thread}"
                         " elements/thread)")
        if self.streaming_stores:
            parts.append("streaming stores")
        if self.prefetch_axis is not None:
            parts.append(f"prefetch next {self.prefetch_axis}")
        return ", ".join(parts) or "scalar"

    def check(self, kernel: Kernel) -> Schedule:
        """Legality: the vector axis is the last axis of its loop; parallel is outermost."""
        if self.vector_axis is not None:
            owner = [lp for lp in kernel.loops() if self.vector_axis in lp.axes]
            if not owner or owner[0].axes[-1] != self.vector_axis or self.vector_width < 2:
                raise TilefoldError(f"schedule: {self.vector_axis} cannot be vectorized here")
        if self.parallel_axis is not None:
            top = kernel.body[0] if len(kernel.body) == 1 else None
            if not isinstance(top, Loop) or top.axes[0] != self.parallel_axis:
                raise TilefoldError(f"schedule: {self.parallel_axis} is not the outermost axis")
        if self.prefetch_axis is not None and prefetching_sweep(kernel, self) is None:
            raise TilefoldError(f"schedule: {self.prefetch_axis} has no row swept more than once")
        return self


def vector_lanes(target: Target) -> int:
    """f32 lanes of the target's widest vector (4 for 128-bit generic x86 and NEON)."""
    return max(target.vector_bits // 32, 4)


def final_stores(kernel: Kernel) -> set[int]:
    """The ids of the stores after which (in program order) no load reads their buffer again:
    the ones worth streaming past the caches (softmax's exp stored, then reloaded to scale,
    is not; the scaled value stored last is)."""
    events: list[tuple[str, object]] = []  # ("load", buffer) / ("store", stmt), in order

    def loads(expr) -> None:
        events.extend(("load", e.buffer) for e in walk_expr(expr) if isinstance(e, Load))

    def visit(stmts) -> None:
        for stmt in stmts:
            if isinstance(stmt, Loop):
                for red in stmt.reductions:
                    loads(red.value)
                visit(stmt.body)
            else:
                loads(stmt.value)
                if isinstance(stmt, Store):
                    events.append(("store", stmt))

    visit(kernel.body)
    final, read_later = set(), set()
    for kind, what in reversed(events):
        if kind == "load":
            read_later.add(what)
        elif what.buffer not in read_later:
            final.add(id(what))
    return final


def prefetching_sweep(kernel: Kernel, schedule: Schedule) -> Loop | None:
    """The loop that issues `schedule.prefetch_axis`'s prefetches: the one before the last of
    two or more vector loops in the body of the outermost loop, whose last axis is the
    prefetch axis."""
    top = kernel.body[0] if len(kernel.body) == 1 else None
    if not isinstance(top, Loop) or not top.axes or top.axes[-1] != schedule.prefetch_axis:
        return None
    sweeps = [s for s in top.body if isinstance(s, Loop) and schedule.vector_axis in s.axes]
    return sweeps[-2] if len(sweeps) >= 2 else None


def choose_schedule(kernel: Kernel, target: Target) -> Schedule:
    """Vectorize the loop-innermost axis along which the most data is contiguous (a buffer
    weighs as many as the axes it spans, as a proxy for its size; ties go to the later axis),
    unroll to hide latency, parallelize the outermost axis, and prefetch the next row of a
    row swept more than once (streaming stores are a call's choice: `compile.py` makes it
    from the outputs' sizes)."""
    innermost = {lp.axes[-1] for lp in kernel.loops() if lp.axes}
    if not innermost:
        return Schedule(None)

    def score(axis: str) -> tuple[int, int]:
        unit = sum(sum(s != 0 for s in b.strides) for b in kernel.buffers
                   if kernel.stride(b.name, axis) == 1)
        return unit, kernel.axis_index(axis)

    top = kernel.body[0] if len(kernel.body) == 1 and isinstance(kernel.body[0], Loop) else None
    parallel = top.axes[0] if top is not None and top.axes else None
    unroll = 4 if target.vector_registers >= 32 else 2
    schedule = Schedule(max(innermost, key=score), vector_lanes(target), unroll, parallel)
    if top is not None and top.axes:
        rows = dataclasses.replace(schedule, prefetch_axis=top.axes[-1])
        if prefetching_sweep(kernel, rows) is not None:
            return rows
    return schedule
