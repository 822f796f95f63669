"""Which dims of a group's values index one iteration axis, read off what the ops mean.

NumPy broadcasting lines an elementwise op's operands up with its result by their trailing
dims (a size-1 dim facing a larger one broadcasts and joins nothing); a reduction keeps or drops
the dims it reduces; a normalizing op (softmax, the norms: the `normalizing` trait) keeps its
operand's dims, and its weights line up with the normalized dims; expand_dims, squeeze and
transpose move dims around.

Kernels take an operand's role (one value per row, one row shared by all rows, a full tile)
from these classes, never from its shape alone: an [N] bias and an [M] per-row sum have the
same shape when M == N, yet NumPy broadcasts the first along rows and a kernel computes the
second once per row.
"""

from __future__ import annotations

from tilefold.errors import UnsupportedError
from tilefold.ir.core import Operation, Value
from tilefold.ir.shapes import normalize_axes
from tilefold.ir.types import Dim

Pair = tuple[Value, int]  # (value, dim)


def is_one(d: Dim) -> bool:
    return isinstance(d, int) and d == 1


class AxisClasses:
    """Union-find over (value, dim) pairs: pairs in one class index the same axis."""

    def __init__(self) -> None:
        self.parent: dict[Pair, Pair] = {}

    def find(self, key: Pair) -> Pair:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: Pair, b: Pair) -> None:
        self.parent[self.find(a)] = self.find(b)

    def align(self, op: Operation) -> frozenset[Pair]:
        """Join the dims `op` lines up; return the (operand, dim) pairs it reduces over.

        Raises UnsupportedError for an op that does not map dims one to one (reshape, concat,
        gather, matmul, ...)."""
        out = op.results[0] if op.results else None
        if op.has_trait("elementwise") or op.name == "broadcast_to":
            operands = op.operands[:1] if op.name == "broadcast_to" else op.operands
            for x in operands:
                self._broadcast(x, out)
            return frozenset()
        if op.has_trait("normalizing"):
            x, axes = op.operands[0], op.reduced_axes()
            for j in range(x.type.rank):
                self.union((x, j), (out, j))
            for w in op.operands[1:]:
                for k in range(w.type.rank):
                    self.union((w, k), (x, axes[k]))
            return frozenset((x, j) for j in axes)
        if op.has_trait("reduction"):
            x, axes = op.operands[0], op.reduced_axes()
            kept = [j for j in range(x.type.rank) if j not in axes]
            for k, j in enumerate(kept):
                self.union((x, j), (out, j if op.attr("keepdims") else k))
            return frozenset((x, j) for j in axes)
        if op.name in ("expand_dims", "squeeze"):
            x = op.operands[0]
            big, small = (out, x) if op.name == "expand_dims" else (x, out)
            axes = normalize_axes(op.name, op.attr("axes"), big.type.rank)
            kept = [j for j in range(big.type.rank) if j not in axes]
            for k, j in enumerate(kept):
                self.union((big, j), (small, k))
            return frozenset()
        if op.name == "transpose":
            for i, p in enumerate(op.attr("perm")):
                self.union((out, i), (op.operands[0], p))
            return frozenset()
        if op.name == "constant":
            return frozenset()
        raise UnsupportedError(f"'{op.name}' does not map its operands' dims one to one onto "
                               "its result's")

    def _broadcast(self, x: Value, out: Value) -> None:
        """NumPy broadcasting: x's dims face out's trailing dims."""
        shift = out.type.rank - x.type.rank
        for j, d in enumerate(x.type.shape):
            if not (is_one(d) and not is_one(out.type.shape[j + shift])):
                self.union((x, j), (out, j + shift))
