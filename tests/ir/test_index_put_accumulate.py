"""`index_put` with `accumulate` (`ir.ops.index.put`): the occurrence-ranked `+=` that runs an
embedding's gradient must give every element the same sums in the same order as
`np.add.at`, bit for bit, whatever the axis, negative indices and repeats."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.ir.ops import index as index_ops


@pytest.mark.parametrize(("shape", "axis", "count", "repeats"), [
    ((3000, 48), 0, 700, 5),  # an embedding table's rows, a token repeated
    ((6, 900, 5), 1, 400, 3),  # an inner axis
    ((40, 300), 1, 200, index_ops.MAX_OCCURRENCES + 4),  # too many repeats: np.add.at
    ((50, 4), 0, 9, 2),  # too small to rank: np.add.at
])
def test_accumulating_put_matches_add_at_bit_for_bit(shape, axis, count, repeats,
                                                     monkeypatch) -> None:
    rng = np.random.default_rng(3)
    index = rng.integers(-shape[axis], shape[axis], count)
    index[:repeats] = index[0]  # one index `repeats` times
    index[repeats] = index[0] - shape[axis] if index[0] >= 0 else index[0] + shape[axis]
    key = tuple(index if a == axis else slice(None) for a in range(len(shape)))
    values = rng.standard_normal((*shape[:axis], count, *shape[axis + 1:])).astype(np.float32)
    start = rng.standard_normal(shape).astype(np.float32)
    want = start.copy()
    np.add.at(want, key, values)
    ranked = []
    monkeypatch.setattr(index_ops, "_add_by_occurrence",
                        lambda *a, f=index_ops._add_by_occurrence: ranked.append(f(*a)) or
                        ranked[-1])
    got = start.copy()
    index_ops.put(got, values, key, accumulate=True)
    assert got.tobytes() == want.tobytes()
    small = values.size < index_ops.SMALL_ADD
    assert ranked == [not small and repeats + 1 <= index_ops.MAX_OCCURRENCES]
