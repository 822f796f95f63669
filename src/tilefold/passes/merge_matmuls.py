"""merge-matmuls: matmuls of one activation by constant weights become one wider matmul.

Attention's query, key and value projections read the same input: three GEMMs of N = d each
stream it three times and pay three calls. Concatenating the weights (and their bias vectors)
along N makes one GEMM of N = 3d whose result is sliced per projection; slices are views, so
the consumers read the parts in place (XLA's and Inductor's horizontal fusion of such GEMMs).

    %q = matmul(%x, %wq) {transpose_b = true}      %w = constant() {value = [wq; wk]}
    %qb = add(%q, %bq)                         ->  %m = matmul(%x, %w) {transpose_b = true}
    %k = matmul(%x, %wk) {transpose_b = true}      %mb = add(%m, %b)   // b = [bq, bk]
    %kb = add(%k, %bk)                             %qb = slice(%mb) [.., 0:d]; %kb = [.., d:2d]

Members must share the activation, transposes, dtype and K; each weight is a 2-D constant; a
member's result feeds exactly one `add` of a 1-D constant bias (all members) or nothing else
special (no member has one).

A concatenation is made once for the same parts (the same arrays, checked equal to it): a
model's prompt and decode graphs share the merged weight, and with it its packed copy. Parts
that already lie one after another in one array (rows of one buffer, as the GGUF builder reads
a layer's projections) are viewed as the merged weight, not copied.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import numpy as np

from tilefold.ir import Function, Operation
from tilefold.passes.base import Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter, constant_of

END = 9223372036854775807  # slice stop: to the end of the axis

# Merged weights by their parts' memory (address, shape, strides, dtype), held weakly.
_MERGED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _root(array: np.ndarray) -> np.ndarray:
    """The array at the end of `array`'s chain of NumPy bases (itself if it owns its data)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def adjacent(parts: list[np.ndarray], axis: int) -> np.ndarray | None:
    """The view of memory that is `np.concatenate(parts, axis)` where the parts are C-contiguous
    views of one C-contiguous array, following one another along axis 0, else None."""
    base = _root(parts[0])
    if axis != 0 or not base.flags.c_contiguous or any(
            _root(p) is not base or not p.flags.c_contiguous or p.dtype != base.dtype
            or p.shape[1:] != parts[0].shape[1:] for p in parts):
        return None
    at = [p.__array_interface__["data"][0] for p in parts]
    if any(a + p.nbytes != b for a, p, b in zip(at, parts, at[1:], strict=False)):
        return None
    start = (at[0] - base.__array_interface__["data"][0]) // base.itemsize
    rows = sum(p.shape[0] for p in parts)
    size = rows * int(np.prod(parts[0].shape[1:]))
    if start < 0 or start + size > base.size:
        return None
    return base.reshape(-1)[start:start + size].reshape(rows, *parts[0].shape[1:])


def concatenated(parts: list[np.ndarray], axis: int) -> np.ndarray:
    """`np.concatenate(parts, axis)`, the same array again for parts at the same memory whose
    values it still holds (compared, not assumed: a weight changed in place is merged anew), a
    view where the parts are `adjacent`."""
    view = adjacent(parts, axis)
    if view is not None:
        return view
    key = (axis, tuple((p.__array_interface__["data"][0], p.shape, p.strides, p.dtype.str)
                       for p in parts))
    found = _MERGED.get(key)
    if found is not None:
        cuts = np.cumsum([p.shape[axis] for p in parts])[:-1]
        if all(np.array_equal(piece, part)
               for piece, part in zip(np.split(found, cuts, axis), parts, strict=True)):
            return found
    merged = _MERGED[key] = np.concatenate(parts, axis=axis)
    return merged


@register_pass
class MergeMatmuls(Pass):
    """Merge matmuls of one activation by constant weights into one wider matmul."""

    statistics = (Statistic("num-merged", "matmuls folded into a wider one"),)

    def run_on_function(self, fn: Function) -> None:
        uses = fn.uses()
        groups: dict[tuple, list[Operation]] = defaultdict(list)
        for op in fn.body.ops:
            w = constant_of(op.operands[1]) if op.name == "matmul" else None
            if w is None or w.ndim != 2:
                continue
            tb = bool(op.attr("transpose_b"))
            k = w.shape[1] if tb else w.shape[0]
            key = (op.operands[0], bool(op.attr("transpose_a")), tb, k, str(w.dtype))
            groups[key].append(op)
        rewriter = Rewriter(fn)
        for members in groups.values():
            if len(members) < 2:
                continue
            biased = [self._bias(m, uses) for m in members]
            if any(b is None for b in biased) and not all(b is None for b in biased):
                continue
            self._merge(rewriter, members, biased)

    @staticmethod
    def _bias(mm: Operation, uses: dict) -> tuple[Operation, np.ndarray] | None:
        """(the add, its bias) when the member's only user adds a 1-D constant of the result's
        width."""
        users = uses.get(mm.results[0], [])
        if len(users) != 1 or users[0].name != "add":
            return None
        add = users[0]
        other = [v for v in add.operands if v is not mm.results[0]]
        bias = constant_of(other[0]) if len(other) == 1 else None
        width = mm.results[0].type.shape[-1]
        if (bias is None or bias.shape != (width,) or bias.dtype != constant_of(
                mm.operands[1]).dtype or add.results[0].type != mm.results[0].type):
            return None
        return add, bias

    def _merge(self, rewriter: Rewriter, members: list[Operation],
               biased: list[tuple[Operation, np.ndarray] | None]) -> None:
        first = members[0]
        tb = bool(first.attr("transpose_b"))
        weights = [constant_of(m.operands[1]) for m in members]
        widths = [w.shape[0] if tb else w.shape[1] for w in weights]
        wcat = concatenated(weights, 0 if tb else 1)
        w = rewriter.create(first, "constant", [], {"value": wcat}, loc=first.loc).results[0]
        out = rewriter.create(first, "matmul", [first.operands[0], w], dict(first.attrs),
                              loc=first.loc).results[0]
        adds = [b[0] if b is not None else None for b in biased]
        if biased[0] is not None:
            bcat = np.concatenate([bias for _, bias in biased])
            b = rewriter.create(first, "constant", [], {"value": bcat}, loc=first.loc).results[0]
            out = rewriter.create(first, "add", [out, b], {}, loc=first.loc).results[0]
        rank = len(out.type.shape)
        parts, start = [], 0
        for mm, add, width in zip(members, adds, widths, strict=True):
            last = add if add is not None else mm
            name = last.results[0].name  # the slice takes over the member's name
            last.results[0].name = rewriter.fresh_name()
            attrs = {"starts": [0] * (rank - 1) + [start],
                     "stops": [END] * (rank - 1) + [start + width], "steps": [1] * rank}
            parts.append(rewriter.create(first, "slice", [out], attrs, [name],
                                         loc=mm.loc).results[0])
            start += width
        for mm, add, part in zip(members, adds, parts, strict=True):
            rewriter.replace(add if add is not None else mm, [part])
            if add is not None:
                mm.erase()
        self.count("num-merged", len(members))
