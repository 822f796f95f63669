"""Workspace sharing: buffers of a step program whose lifetimes do not overlap share memory.

The plan gives every intermediate and every kernel's scratch a buffer of its own (108 MB for
MiniLM at 8 x 128), but a call of the step program touches only a few, and the calls run one
after another (`tf_replay`). A workspace buffer's lifetime is the span of calls from the first
to the last that touches it: through an address argument, an array header of the buffer, or a
parameter block (a data buffer) whose pointer words point into it, followed transitively. Two
buffers whose spans share no call may take the same memory, so they are laid out in one
buffer, the *arena*, at offsets chosen as XLA's and TVM's memory planners do: largest first,
each at the lowest aligned offset that overlaps no placed buffer whose span meets its own.

Only "workspace" buffers share (the plan's intermediates and scratch, allocated empty at load,
whose contents never outlive a model call): inputs, outputs, data (constants, parameter
blocks), status words and any other kind keep memory of their own, and so does a workspace
buffer an input or output refers to. The program keeps its format: the arena is an ordinary
workspace buffer and each reference (buffer, offset) becomes (arena, its place + offset), so
both loaders run it unchanged. Offsets may be size formulas (`{"n": [c, k]}`, `{"t": [...]}`
of a symbolic class, `aot/symbolic.py`): a place is added to them.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from tilefold.artifact.format import ALIGN

log = logging.getLogger("tilefold.aot")


def _slot(nbytes: int) -> int:
    """The bytes a buffer takes in the arena: aligned, with `ALIGN` to spare after it (as
    the loaders leave after each buffer)."""
    return -(-(nbytes + ALIGN) // ALIGN) * ALIGN


def lifetimes(steps: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """The first and last call touching each buffer some call touches."""
    reach: dict[int, set[int]] = {}  # a parameter block's pointer words: buffers they reach
    for where, to in steps["pointers"]:
        reach.setdefault(where[0], set()).add(to[0])
    spans: dict[int, tuple[int, int]] = {}
    for i, call in enumerate(steps["calls"]):
        todo = []
        for kind, value in call["args"]:
            if kind == "addr":
                todo.append(value[0])
            elif kind == "object":
                todo.append(steps["objects"][value]["at"][0])
        seen: set[int] = set()
        while todo:
            b = todo.pop()
            if b not in seen:
                seen.add(b)
                todo += reach.get(b, ())
        for b in seen:
            first, _ = spans.get(b, (i, i))
            spans[b] = (first, i)
    return spans


def place(sizes: dict[int, int], spans: dict[int, tuple[int, int]]) -> tuple[dict[int, int],
                                                                              int]:
    """Offsets in one arena for buffers of these sizes (bytes, each given its slot) and
    spans, no two whose spans meet overlapping; and the arena's size."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first call, last call)
    at: dict[int, int] = {}
    order = sorted(sizes, key=lambda b: (-_slot(sizes[b]), spans[b][0], b))
    for b in order:
        first, last = spans[b]
        need = _slot(sizes[b])
        offset = 0
        for low, high, _, _ in sorted(p for p in placed if p[2] <= last and first <= p[3]):
            if low - offset >= need:
                break
            offset = max(offset, high)
        at[b] = offset
        placed.append((offset, offset + need, first, last))
    return at, max((p[1] for p in placed), default=0)


def _shift(offset: Any, by: int) -> Any:
    """`offset` (an int or a size formula) plus `by`."""
    if isinstance(offset, dict) and offset.keys() == {"n"}:
        c, k = offset["n"]
        return {"n": [c + by, k]}
    if isinstance(offset, dict) and offset.keys() == {"t"}:
        lo, *values = offset["t"]
        return {"t": [lo, *(v + by for v in values)]}
    return offset + by


def share_workspace(steps: dict[str, Any]) -> dict[str, Any]:
    """`steps` (program.json's form, `Program.layout`) with its shareable workspace buffers
    laid out in one arena by their lifetimes; unchanged when fewer than two can share."""
    buffers = steps["buffers"]
    if any(type(b) is not int for where, to in steps["pointers"] for b in (where[0], to[0])) \
            or any(type(o["at"][0]) is not int for o in steps["objects"]):
        return steps  # buffer numbers that vary with the size: left as they are
    pinned = {ref["at"][0] for side in ("inputs", "outputs") for ref in steps[side]}
    pinned |= set(steps["status"])
    spans = lifetimes(steps)
    shared = {b: spec["bytes"] for b, spec in enumerate(buffers)
              if spec["kind"] == "workspace" and b not in pinned and b in spans
              and type(spec["bytes"]) is int}
    if len(shared) < 2:
        return steps
    at, size = place(shared, {b: spans[b] for b in shared})
    peak = max(sum(_slot(shared[b]) for b in shared if spans[b][0] <= i <= spans[b][1])
               for i in range(len(steps["calls"])))
    log.info("workspace: %d buffers of %.1f MB share an arena of %.1f MB (live at once at "
             "most: %.1f MB)", len(shared), sum(map(_slot, shared.values())) / 1e6,
             size / 1e6, peak / 1e6)
    kept = [b for b in range(len(buffers)) if b not in shared]
    number = {old: new for new, old in enumerate(kept)}
    arena = len(kept)
    steps = copy.deepcopy(steps)

    def moved(ref: list) -> list:
        b, offset = ref[0], ref[1]
        if b in shared:
            return [arena, _shift(offset, at[b]), *ref[2:]]
        return [number[b], offset, *ref[2:]]

    for call in steps["calls"]:
        call["args"] = [[kind, moved(value)] if kind == "addr" else [kind, value]
                        for kind, value in call["args"]]
    for o in (*steps["objects"], *steps["inputs"], *steps["outputs"]):
        o["at"] = moved(o["at"])
    steps["pointers"] = [[moved(where), moved(to)] for where, to in steps["pointers"]]
    if "patches" in steps:
        steps["patches"] = [moved(p) for p in steps["patches"]]
    steps["status"] = [number[b] for b in steps["status"]]
    steps["buffers"] = [buffers[b] for b in kept] + [{"kind": "workspace", "bytes": size}]
    return steps


def workspace_bytes(steps: dict[str, Any]) -> int:
    """What the loaders allocate for a static program's buffers other than data."""
    return sum(_slot(b["bytes"]) for b in steps["buffers"] if b["kind"] != "data")
