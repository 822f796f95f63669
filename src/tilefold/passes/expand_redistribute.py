"""expand-redistribute: rewrite each `redistribute` into the one-axis collectives that take its
operand's placements to the target ones, by a shortest-path search over placements.

One step changes one mesh axis (R->S: local_slice, S->R: all_gather, P->R: all_reduce,
P->S: reduce_scatter, S(i)->S(j): all_to_all) and is legal when no later mesh axis splits a dim
it touches (inner blocks must move first), no later axis holds partials of another reduction,
and the new placements split the shape evenly. Among
the paths, the fewest communicating steps win, then the fewest steps, so [S(0),S(1)] ->
[S(1),S(0)] becomes all_gather, all_to_all, local_slice.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

from tilefold.errors import PassError, TilefoldError
from tilefold.ir import Function
from tilefold.ir import types as ty
from tilefold.passes.base import Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter


class Step(NamedTuple):
    """One collective: its op name, mesh axis name, and attributes besides the axis."""

    op: str
    axis: str
    attrs: dict[str, int]


def step_op(src: ty.Placement, dst: ty.Placement) -> str | None:
    """The collective taking one axis from `src` to `dst`, or None if none does."""
    if isinstance(src, ty.Partial):
        return {ty.Replicate: "all_reduce", ty.Shard: "reduce_scatter"}.get(type(dst))
    if isinstance(src, ty.Shard):
        return {ty.Replicate: "all_gather", ty.Shard: "all_to_all"}.get(type(dst))
    return "local_slice" if isinstance(dst, ty.Shard) else None


def legal(placements: tuple[ty.Placement, ...], axis: int, dst: ty.Placement) -> bool:
    """No mesh axis after `axis` splits a dim that the step on `axis` moves, or holds partials
    of another reduction than the one the step performs (sums and maxes do not commute)."""
    src = placements[axis]
    dims = {p.dim for p in (src, dst) if isinstance(p, ty.Shard)}
    later = placements[axis + 1 :]
    if isinstance(src, ty.Partial) and any(isinstance(p, ty.Partial) and p != src for p in later):
        return False
    return not any(isinstance(p, ty.Shard) and p.dim in dims for p in later)


def redistribute_steps(t: ty.TensorType, target: tuple[ty.Placement, ...]) -> list[Step]:
    """The collectives that take sharded type `t` to placements `target` (the cheapest path)."""
    paths = _search(t, tuple(target))
    if tuple(target) not in paths:
        raise PassError(f"expand-redistribute: no collectives take {t} to "
                        f"{list(map(str, target))}")
    return paths[tuple(target)]


def redistribute_paths(t: ty.TensorType) -> dict[tuple[ty.Placement, ...], list[Step]]:
    """The cheapest path from sharded type `t` to every placement tuple it can reach (each
    the one `redistribute_steps` gives)."""
    return _search(t, None)


def _search(t: ty.TensorType, target: tuple[ty.Placement, ...] | None
            ) -> dict[tuple[ty.Placement, ...], list[Step]]:
    """Dijkstra over placement tuples from `t`'s, until `target` (None: everywhere);
    cost = (communicating steps, steps), ties broken by the order states were reached."""
    assert t.sharding is not None
    mesh, start = t.sharding.mesh, t.sharding.placements
    padded = {p.dim for p in (*start, *(target or ())) if isinstance(p, ty.Shard) and p.pad}
    choices = [ty.Replicate(), *(ty.Shard(d) for d in range(t.rank)),
               *(ty.Shard(d, True) for d in sorted(padded))]
    queue: list[tuple[int, int, int, tuple[ty.Placement, ...]]] = [(0, 0, 0, start)]
    best: dict[tuple[ty.Placement, ...], tuple[int, int]] = {start: (0, 0)}
    back: dict[tuple[ty.Placement, ...], tuple[tuple[ty.Placement, ...], Step]] = {}
    done: list[tuple[ty.Placement, ...]] = []
    order = 0
    while queue:
        comm, steps, _, state = heapq.heappop(queue)
        if best.get(state) != (comm, steps):
            continue
        done.append(state)
        if state == target:
            break
        for axis, name in enumerate(mesh.names):
            for dst in choices:
                op = step_op(state[axis], dst)
                if op is None or dst == state[axis] or not legal(state, axis, dst):
                    continue
                new = ty.Sharding(mesh, state).replace(axis, dst)
                if ty.sharding_problem(t.with_sharding(new)) is not None:
                    continue
                cost = (comm + (op != "local_slice"), steps + 1)
                if cost < best.get(new.placements, (1 << 30, 0)):
                    best[new.placements] = cost
                    attrs = {"dim": dst.dim} if op in ("reduce_scatter", "all_to_all",
                                                       "local_slice") else {}
                    if attrs and dst.pad:  # a padded shard (S(d,pad)) is made padded
                        attrs["pad"] = True
                    back[new.placements] = (state, Step(op, name, attrs))
                    order += 1
                    heapq.heappush(queue, (*cost, order, new.placements))
    paths: dict[tuple[ty.Placement, ...], list[Step]] = {}
    for state in done if target is None else [s for s in done if s == target]:
        path, at = [], state
        while at != start:
            at, step = back[at]
            path.append(step)
        paths[state] = path[::-1]
    return paths


@register_pass
class ExpandRedistribute(Pass):
    """Rewrite redistribute into all_gather, all_reduce, reduce_scatter and all_to_all."""

    statistics = (
        Statistic("num-expanded", "redistribute ops rewritten"),
        Statistic("num-collectives", "collectives created"),
    )

    def run_on_function(self, fn: Function) -> None:
        rewriter = Rewriter(fn)
        for op in [op for op in fn.walk() if op.name == "redistribute"]:
            value = op.operands[0]
            target = op.result.type.sharding.placements
            for step in redistribute_steps(value.type, target):
                try:
                    made = rewriter.create(op, step.op, [value], {"axis": step.axis, **step.attrs},
                                           loc=op.loc)
                except TilefoldError as exc:  # a bug in the search: it checked every step
                    raise PassError(f"expand-redistribute: {exc.message}") from None
                value = made.result
                self.count("num-collectives")
            rewriter.replace(op, [value])
            self.count("num-expanded")
