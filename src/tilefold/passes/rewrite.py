"""IR editing the passes share: create ops with inferred types, replace results, erase ops.

A `Rewriter` edits one function and hands out fresh value names without rescanning it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefold.errors import Location
from tilefold.ir import OPS, Block, Function, Operation, Value


def constant_of(value: Value) -> np.ndarray | None:
    """The array of a value defined by `constant`, else None."""
    op = value.defining_op
    return op.attrs["value"] if op is not None and op.name == "constant" else None


def splat_of(value: Value) -> Any:
    """The element of a non-empty constant whose elements are all equal (bit for bit), else None.

    The element is a NumPy scalar, so `-0.0` and `0.0` stay apart through `np.signbit`.
    """
    array = constant_of(value)
    if array is None or array.size == 0:
        return None
    flat = np.ascontiguousarray(array).reshape(-1)
    rows = np.frombuffer(flat.tobytes(), np.uint8).reshape(flat.size, -1)
    return flat[0] if (rows == rows[0]).all() else None


def use_counts(block: Block) -> Counter[Value]:
    """How many operands refer to each value, over `block` and the regions nested in it."""
    counts: Counter[Value] = Counter()
    for op in block.walk():
        counts.update(op.operands)
    return counts


def is_removable(op: Operation) -> bool:
    """An op that may be erased once its results are unused: pure and not a terminator."""
    return op.has_trait("pure") and not op.has_trait("terminator")


class Rewriter:
    """Edits one function: creates ops before an anchor, replaces results, erases ops."""

    def __init__(self, fn: Function):
        self.fn = fn
        self.taken = {v.name for v in fn.values()}
        self.counter = 0

    def fresh_name(self) -> str:
        while str(self.counter) in self.taken:
            self.counter += 1
        name = str(self.counter)
        self.taken.add(name)
        return name

    def create(
        self,
        before: Operation,
        name: str,
        operands: Sequence[Value],
        attrs: dict[str, Any],
        names: Sequence[str] | None = None,
        loc: Location | None = None,
    ) -> Operation:
        """Insert op `name` before `before`, with normalized attributes and inferred types.

        Raises the op's TilefoldError when the operands do not fit it.
        """
        opdef = OPS[name]
        norm = opdef.check_signature(len(operands), attrs)
        types = opdef.infer_op([v.type for v in operands], opdef.full_attrs(norm), [])
        names = list(names) if names is not None else [self.fresh_name() for _ in types]
        op = Operation(opdef, list(operands), norm, types, names, loc=loc)
        block = before.parent
        assert block is not None, f"{before.name} is not in a block"
        block.insert(block.ops.index(before), op)
        return op

    def replace(self, op: Operation, values: Sequence[Value]) -> None:
        """Make every use of `op`'s results use `values` instead, then erase `op`."""
        for old, new in zip(op.results, values, strict=True):
            if old is not new:
                self.fn.replace_all_uses(old, new)
        op.erase()

    def erase_dead(self) -> int:
        """Erase removable ops whose results are unused, innermost and last first; the count."""
        return self._erase_dead(self.fn.body, use_counts(self.fn.body))

    def _erase_dead(self, block: Block, uses: Counter[Value]) -> int:
        erased = 0
        for op in reversed(list(block.ops)):
            if is_removable(op) and not any(uses[r] for r in op.results):
                uses.subtract(v for inner in op.walk() for v in inner.operands)
                op.erase()
                erased += 1
                continue
            for region in op.regions:
                erased += self._erase_dead(region, uses)
        return erased
