"""Shape arithmetic over static and symbolic dims: broadcasting, axes, element-count equality."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from tilefold.errors import ShapeError
from tilefold.ir import dims
from tilefold.ir.types import Dim, SymDim


def broadcast_shapes(op: str, *shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """NumPy broadcasting; a symbolic dim broadcasts only with itself or with 1."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            listed = " and ".join(f"[{','.join(map(str, s))}]" for s in shapes)
            raise ShapeError(
                f"{op}: shapes {listed} do not broadcast (axis {axis - rank}: "
                f"{', '.join(sorted(map(str, sizes)))}); reshape or broadcast_to first"
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def normalize_axis(op: str, axis: int, rank: int) -> int:
    """`axis` in [0, rank); negative axes count from the end, as in NumPy."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def normalize_axes(op: str, axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Axes in [0, rank), sorted; None means all axes. Duplicates are an error."""
    if axes is None:
        return tuple(range(rank))
    norm = tuple(sorted(normalize_axis(op, a, rank) for a in axes))
    if len(set(norm)) != len(norm):
        raise ShapeError(f"{op}: repeated axis in {list(axes)}")
    return norm


def factors(shape: Sequence[Dim]) -> tuple[int, Counter]:
    """The element count of `shape` as (static product, multiset of symbolic dim names); a
    multiple of one monomial (`?(2*s0)`, a concat of a tensor with itself; `?(s0*s1)`, two
    dims flattened) is its factor and the monomial's symbols."""
    static = math.prod(d for d in shape if isinstance(d, int))
    names: Counter = Counter()
    for d in shape:
        if isinstance(d, SymDim):
            terms, const = (dims.parse(d.name) if dims.is_derived(d.name) else None) or ({}, 1)
            if len(terms) == 1 and const == 0 and next(iter(terms.values())) > 0:
                (monomial, coefficient), = terms.items()
                static *= coefficient
                names.update(dims.symbols_of(monomial))
            else:
                names[d.name] += 1
    return static, names


def resolve_reshape(op: str, source: Sequence[Dim], target: Sequence[Dim]) -> tuple[Dim, ...]:
    """Fill a `-1` in `target` and check that both shapes hold the same number of elements."""
    holes = [i for i, d in enumerate(target) if d == -1]
    if len(holes) > 1:
        raise ShapeError(f"{op}: at most one -1 allowed in shape {list(map(str, target))}")
    if any(isinstance(d, int) and d < -1 for d in target):
        raise ShapeError(f"{op}: negative size in shape {list(map(str, target))}")
    src_static, src_syms = factors(source)
    known = [d for d in target if d != -1]
    dst_static, dst_syms = factors(known)
    shown = f"[{','.join(map(str, source))}] to [{','.join(map(str, target))}]"
    if holes:
        rest_syms = src_syms - dst_syms
        if dst_syms - src_syms or (dst_static == 0 and src_static != 0):
            raise ShapeError(f"{op}: cannot reshape {shown}")
        if dst_static == 0 or src_static % dst_static:
            raise ShapeError(f"{op}: cannot reshape {shown}: sizes do not divide")
        ratio = src_static // dst_static
        if any(not dims.SYMBOL.fullmatch(s) for s in rest_syms):  # a sum: no factor of it
            raise ShapeError(f"{op}: cannot infer -1 in {shown}; name the symbolic dim instead")
        fill: Dim = ratio  # or, the rest of the elements: a multiple of the symbols' product
        if rest_syms:
            fill = SymDim(dims.render({"*".join(sorted(rest_syms.elements())): ratio}, 0))
        return tuple(fill if i == holes[0] else d for i, d in enumerate(target))
    if (src_static, src_syms) != (dst_static, dst_syms) and src_static | dst_static:
        raise ShapeError(f"{op}: cannot reshape {shown}: element counts differ")
    return tuple(target)
