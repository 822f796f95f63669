"""The optimizing search: an integer program (`scipy.optimize.milp`) choosing, for every
argument, a placement tuple, for every op, a strategy its sharding rule accepts (operand
placements -> result placement), and for every op result, the placement its users receive.

    minimize   sum  compute(op, strategy)  +  sum  redistribute(result placement -> delivered)
    subject to one choice per argument, op and result;
               an op's strategy needs each operand delivered as it requires;
               sum of the arguments' bytes per device <= memory limit (parameters times
               TRAINING_STATE for a training step; activations are not counted)
    (values named alike in repeated layers, `%l0_q` and `%l1_q`, share one choice.)

The redistribute edges are a transportation polytope between an op's result placement and the
delivered one, so they can be continuous; the choices are binary.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tilefold.distributed.cost import FREE, CostModel, nbytes, split_elsewhere
from tilefold.distributed.plan import Placements, Plan, function
from tilefold.distributed.rules import Einsum, rule_for
from tilefold.distributed.strategies.base import (
    Constraints,
    Strategy,
    StrategyError,
    register_strategy,
)
from tilefold.errors import TilefoldError
from tilefold.ir import Module, parse_module, print_module
from tilefold.ir import types as ty
from tilefold.ir.core import Function, Operation, Value

TRAINING_STATE = 4  # bytes per parameter byte in training: weight, gradient, two moments
# (the data arguments count once)


@dataclass
class Choice:
    """One op's strategy: what it needs of each operand, what it gives, what it costs."""

    operands: tuple[Placements, ...]
    result: Placements
    seconds: float


@dataclass
class Problem:
    """The integer program under construction: columns with costs and bounds, sparse rows."""

    costs: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    rows: list[tuple[dict[int, float], float, float]] = field(default_factory=list)
    objective: float = 0.0

    def column(self, cost: float, binary: bool) -> int:
        self.costs.append(cost)
        self.integer.append(int(binary))
        self.upper.append(1.0 if binary else np.inf)
        return len(self.costs) - 1

    def row(self, coefs: dict[int, float], low: float, high: float) -> None:
        self.rows.append((coefs, low, high))

    def solve(self) -> np.ndarray:
        try:
            from scipy.optimize import Bounds, LinearConstraint, milp
            from scipy.sparse import coo_array
        except ImportError:
            raise StrategyError("the ilp strategy solves with scipy.optimize.milp: install "
                                "scipy>=1.9 (pip install 'tilefold[distributed]')") from None
        r, c, v = [], [], []
        for i, (coefs, _, _) in enumerate(self.rows):
            for j, a in coefs.items():
                r.append(i)
                c.append(j)
                v.append(a)
        matrix = coo_array((v, (r, c)), shape=(len(self.rows), len(self.costs))).tocsr()
        result = milp(np.array(self.costs), integrality=np.array(self.integer),
                      bounds=Bounds(0, np.array(self.upper)),
                      constraints=LinearConstraint(matrix, [lo for _, lo, _ in self.rows],
                                                   [hi for _, _, hi in self.rows]))
        if result.x is None:
            raise StrategyError(f"ilp: no plan fits the constraints ({result.message})")
        self.objective = float(result.fun)
        return result.x


def axis_options(t: ty.TensorType, partial: bool) -> list[ty.Placement]:
    shards = [ty.Shard(d) for d in range(t.rank)]
    return [ty.Replicate(), *shards, *([ty.Partial()] if partial else [])]


def tuples(t: ty.TensorType, mesh: ty.Mesh, pad: bool = False) -> list[Placements]:
    """Every placement tuple of an argument of type `t` that splits it evenly, or with `pad`
    padded where it does not (R alone on an axis of one device)."""
    out = []
    options = [axis_options(t, False) if n > 1 else [ty.Replicate()] for n in mesh.sizes]
    for ps in itertools.product(*options):
        placed = fitted(t.with_sharding(ty.Sharding(mesh, ps)), pad)
        if placed is not None and placed.sharding.placements not in out:
            out.append(placed.sharding.placements)
    return out


def fitted(t: ty.TensorType, pad: bool) -> ty.TensorType | None:
    """`t` if its placements split it evenly, padded where they do not if `pad`, else None."""
    if pad:
        t = ty.pad_uneven(t)
    return None if ty.sharding_problem(t) else t


def per_axis(einsum: Einsum, op: Operation, args: set[Value]) -> list[tuple]:
    """(operand placements, result placement) on one mesh axis that the rule accepts."""
    options = [axis_options(v.type, v not in args) for v in op.operands]
    found = []
    for combo in itertools.product(*options):
        got = einsum.on_axis(combo)
        if not isinstance(got, str):
            found.append((combo, got))
    return found


class Search:
    """One ILP search over one function (a scratch copy whose types it rewrites freely)."""

    objective: float = 0.0

    def __init__(self, fn: Function, mesh: ty.Mesh, cost: CostModel, constraints: Constraints):
        self.fn, self.mesh, self.cost, self.constraints = fn, mesh, cost, constraints
        self.args = set(fn.args)
        self.edges: dict[tuple, float | None] = {}
        self.share = re.compile(constraints.share) if constraints.share else None
        self.users: dict[Value, list[tuple[str, int]]] = defaultdict(list)
        for u in fn.ops:
            for i, w in enumerate(u.operands):
                self.users[w].append((self.key(u.results[0]) if u.results else u.name, i))
        self.classes: dict[str, list[Value]] = defaultdict(list)
        for v in fn.values():
            self.classes[self.key(v)].append(v)
        for key, members in list(self.classes.items()):  # share only values that are alike
            if len({self.signature(v) for v in members}) > 1:
                del self.classes[key]
                for v in members:
                    self.classes[v.name].append(v)
        self.of = {v: key for key, members in self.classes.items() for v in members}

    def key(self, v: Value) -> str:
        m = self.share.match(v.name) if self.share else None
        return "*" + v.name[m.end():] if m else v.name

    def signature(self, v: Value) -> tuple:
        op = v.defining_op
        users = sorted(self.users[v])
        return (str(v.type), op.name if op else "arg", str(op.attrs) if op else "",
                tuple(self.key(w) for w in op.operands) if op else (), tuple(users))

    def choices(self, op: Operation) -> list[Choice]:
        einsum = rule_for(op) if not op.has_trait("sharding") else None
        n = len(self.mesh.axes)
        if einsum is None or len(op.results) != 1:
            combos = [((tuple((ty.Replicate(),) * n for _ in op.operands)), (ty.Replicate(),) * n)]
        else:
            options = per_axis(einsum, op, self.args)
            whole = [c for c in options if c[1] == ty.Replicate()
                     and all(p == ty.Replicate() for p in c[0])]
            axes = [options if size > 1 else whole for size in self.mesh.sizes]
            combos = []
            for pick in itertools.product(*axes):
                operands = tuple(tuple(p[0][i] for p in pick) for i in range(len(op.operands)))
                combos.append((operands, tuple(p[1] for p in pick)))
        found = []
        pad = self.constraints.pad
        for operands, result in combos:
            fits = [fitted(v.type.without_sharding().with_sharding(ty.Sharding(self.mesh, ps)),
                           pad) for v, ps in zip((*op.operands, op.result), (*operands, result),
                                                 strict=True)]
            if any(t is None for t in fits):
                continue
            *types, out = fits
            operands = tuple(t.sharding.placements for t in types)
            result = out.sharding.placements
            for v, t in zip(op.operands, types, strict=True):
                v.type = t
            op.result.type = out
            found.append(Choice(operands, result, self.op_seconds(op, einsum)))
        return found

    def op_seconds(self, op: Operation, einsum: Einsum | None) -> float:
        if op.name in FREE:
            return 0.0
        seconds = self.cost.compute(op).seconds
        if not self.constraints.training:
            return seconds
        seconds *= 3  # forward and the two products of the backward pass
        for i, v in enumerate(op.operands):
            if einsum is not None and v in self.args:
                for axis in split_elsewhere(einsum, op, i):
                    seconds += self.cost.collective("all_reduce", nbytes(v.type), axis).seconds
        return seconds

    def edge(self, t: ty.TensorType, src: Placements, dst: Placements) -> float | None:
        """Seconds to redistribute `t` from `src` to `dst` (None: no path), once per key."""
        if (t, src, dst) not in self.edges:
            try:
                est = self.cost.redistribute(t.with_sharding(ty.Sharding(self.mesh, src)), dst)
                self.edges[t, src, dst] = est.seconds * (2 if self.constraints.training else 1)
            except TilefoldError:
                self.edges[t, src, dst] = None
        return self.edges[t, src, dst]

    def run(self) -> dict[Value, Placements]:
        """The chosen placement of every argument and the delivered one of every result."""
        prob = Problem()
        count = {k: len(v) for k, v in self.classes.items()}
        rep = {k: v[0] for k, v in self.classes.items()}
        pick: dict[str, dict[Placements, int]] = {}  # arg class -> placement -> column
        memory: dict[int, float] = {}
        data = set(self.constraints.data_args(self.fn))
        state = TRAINING_STATE if self.constraints.training else 1
        for key, v in rep.items():
            if v in self.args:
                cols = {}
                for ps in tuples(v.type, self.mesh, self.constraints.pad):
                    cols[ps] = prob.column(0.0, True)
                    t = v.type.with_sharding(ty.Sharding(self.mesh, ps))
                    memory[cols[ps]] = count[key] * nbytes(t) * (1 if v in data else state)
                prob.row({c: 1.0 for c in cols.values()}, 1, 1)
                pick[key] = cols
        ops: dict[str, tuple[Operation, list[Choice], list[int]]] = {}
        for key, v in rep.items():
            op = v.defining_op
            if op is None or key in ops or op.has_trait("terminator"):
                continue
            found = self.choices(op)
            if not found:
                raise StrategyError(f"ilp: %{v.name} ('{op.name}') has no placement that "
                                    "splits evenly, not even replicated")
            cols = [prob.column(c.seconds * count[key], True) for c in found]
            prob.row({c: 1.0 for c in cols}, 1, 1)
            ops[key] = (op, found, cols)
        needs: dict[str, dict[Placements, dict[int, float]]] = defaultdict(
            lambda: defaultdict(dict))  # value class -> placement -> columns requiring it
        seen = set()
        for key, (_, found, cols) in ops.items():
            members = [v.defining_op for v in self.classes[key]]
            for i, w in dict.fromkeys((i, w) for op in members for i, w in enumerate(op.operands)):
                if (key, i, self.of[w]) in seen:
                    continue
                seen.add((key, i, self.of[w]))
                for c, col in zip(found, cols, strict=True):
                    needs[(self.of[w], key, i)][c.operands[i]][col] = 1.0
        wanted: dict[str, set[Placements]] = defaultdict(set)
        for (w, _, _), by in needs.items():
            wanted[w] |= set(by)
        delivered: dict[str, dict[Placements, int]] = {}
        for key, (op, found, cols) in ops.items():
            results = list(dict.fromkeys(c.result for c in found))
            ys = {d: prob.column(0.0, True) for d in sorted(wanted[key] | set(results), key=str)}
            prob.row({y: 1.0 for y in ys.values()}, 1, 1)
            delivered[key] = ys
            # edges: each result placement flows to one delivered placement
            out_rows: dict[Placements, dict[int, float]] = {r: {} for r in results}
            in_rows = {d: {y: -1.0} for d, y in ys.items()}
            t = op.result.type.without_sharding()
            for r in results:
                for d in ys:
                    seconds = self.edge(t, r, d)
                    if seconds is not None:
                        col = prob.column(seconds * count[key], False)
                        out_rows[r][col] = in_rows[d][col] = 1.0
            for c, col in zip(found, cols, strict=True):
                out_rows[c.result][col] = -1.0
            for row in [*out_rows.values(), *in_rows.values()]:
                prob.row(row, 0, 0)
        for (w, _, _), by in needs.items():  # each operand is delivered as its user needs
            targets = pick.get(w) or delivered[w]
            for ps in sorted(set(by) | set(targets), key=str):
                row = dict(by.get(ps, {}))
                if ps in targets:
                    row[targets[ps]] = -1.0
                prob.row(row, 0, 0)
        if self.constraints.memory_limit is not None:
            prob.row(memory, 0, self.constraints.memory_limit)
        x = prob.solve()
        self.objective = prob.objective
        chosen = {}
        for key, cols in [*pick.items(), *delivered.items()]:
            best = max(cols, key=lambda ps, cols=cols: x[cols[ps]])
            for v in self.classes[key]:
                chosen[v] = best
        for key, (_, found, cols) in ops.items():
            best = found[max(range(len(cols)), key=lambda i, cols=cols: x[cols[i]])]
            for v in self.classes[key]:
                if chosen.get(v) == best.result:
                    chosen[v] = None  # delivered as the op gives it: not part of the plan
        return {v: ps for v, ps in chosen.items() if ps is not None}


@register_strategy("ilp")
class ILP(Strategy):
    """The cheapest plan under the cost model, as an integer program; `objective` is the
    modeled seconds of the last plan found."""

    objective: float = 0.0

    def search(self, module: Module, mesh: ty.Mesh, cost: CostModel,
               constraints: Constraints) -> Plan:
        scratch = parse_module(print_module(module))
        fn = function(scratch, constraints.function)
        for v in fn.values():
            if not v.type.is_static:
                raise StrategyError(f"ilp: %{v.name} is {v.type}; planning needs static "
                                    "shapes (bind the symbolic dims first)")
        found = Search(fn, mesh, cost, constraints)
        chosen = found.run()
        self.objective = found.objective  # the modeled seconds of the plan
        entries = [(a.name, chosen[a]) for a in fn.args]
        entries += [(v.name, chosen[v]) for op in fn.ops for v in op.results if v in chosen]
        return Plan(mesh, tuple(entries), "ilp", fn.name)
