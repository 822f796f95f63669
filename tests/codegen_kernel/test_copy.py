"""The native strided copy (`codegen/llvm/cpu/copy.py`): plain copies over any strides (transposed,
sliced, broadcast sources), scatters (`index_put`'s row writes), accumulating scatters (an
embedding's gradient, bit for bit `np.add.at`) and gathers along any axis, against NumPy; an
index out of range sets the status word instead of touching memory."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.codegen.llvm.cpu.copy import MAX_RANK, copy_call, scatter_call

RNG = np.random.default_rng(11)
DTYPES = [np.float32, np.float64, np.int64, np.int16, np.bool_, np.uint8]


def _random(shape, dtype):
    return (RNG.standard_normal(shape) * 100).astype(dtype)


def _status():
    return np.zeros(1, np.int64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 1, 13), (4, 3, 2, 17), (2, 2, 2, 2, 3)])
def test_contiguous_and_transposed_copies(shape, dtype):
    src = _random(shape, dtype)
    dst = np.empty(shape, dtype)
    copy_call(dst, src, status=_status())()
    np.testing.assert_array_equal(dst, src)
    perm = tuple(reversed(range(len(shape))))
    dst_t = np.empty(tuple(shape[p] for p in perm), dtype)
    copy_call(dst_t, src.transpose(perm), status=_status())()
    np.testing.assert_array_equal(dst_t, src.transpose(perm))


def test_sliced_and_broadcast_sources_and_strided_destinations():
    base = _random((6, 9, 11), np.float32)
    src = base[1:5, ::2, 3:10]
    dst_base = np.zeros((4, 10, 7), np.float32)
    dst = dst_base[:, 1:6]
    copy_call(dst, src, status=_status())()
    np.testing.assert_array_equal(dst, src)
    assert not dst_base[:, 0].any() and not dst_base[:, 6:].any()
    k = _random((1, 3, 1, 29, 8), np.float32)
    wide = np.broadcast_to(k, (1, 3, 4, 29, 8))  # a repeat of KV heads: stride 0
    out = np.empty(wide.shape, np.float32)
    copy_call(out, wide, status=_status())()
    np.testing.assert_array_equal(out, wide)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [0, 3])
def test_fills_from_one_broadcast_value(dtype, value):
    """A source repeating one value along contiguous runs is a fill (zeros: a memset); a
    padded destination keeps its gaps."""
    for shape in [(1,), (1000,), (5, 7, 129)]:
        one = np.asarray(value, dtype)
        out = _random(shape, dtype)
        copy_call(out, np.broadcast_to(one, shape), status=_status())()
        np.testing.assert_array_equal(out, np.full(shape, one))
    base = _random((4, 40), dtype)
    keep = base.copy()
    row = np.broadcast_to(_random((4, 1), dtype), (4, 33))  # one value per row
    copy_call(base[:, 3:36], row, status=_status())()
    np.testing.assert_array_equal(base[:, 3:36], row)
    np.testing.assert_array_equal(base[:, :3], keep[:, :3])
    np.testing.assert_array_equal(base[:, 36:], keep[:, 36:])


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_scatter_writes_rows_in_place(axis):
    out = _random((3, 5, 7, 4), np.float32)
    want = out.copy()
    n = 3
    index = RNG.choice(np.arange(-out.shape[axis], out.shape[axis]), n, replace=False)
    keep = {i % out.shape[axis] for i in index}
    if len(keep) < n:  # a repeated position: the last write wins in both
        index = np.array(sorted(keep), np.int64)
        n = len(index)
    index = index.astype(np.int64)
    shape = list(out.shape)
    shape[axis] = n
    values = _random(tuple(shape), np.float32)
    copy_call(out, values, index=index, axis=axis, side="dst", status=_status())()
    key = (slice(None),) * axis + (index,)
    want[key] = values
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize(("shape", "axis", "index_shape", "dtype"), [
    ((300, 48), 0, (8, 16), np.float32),  # an embedding table, a 2-D batch of token ids
    ((2, 40), 0, (64,), np.float32),  # token types: one row hit 64 times, in order
    ((6, 90, 5), 1, (3, 7), np.float64),  # an inner axis
    ((20, 3), 0, (33,), np.int64),
    ((9, 4), 1, (5,), np.int32),  # the innermost axis
])
def test_accumulating_scatter_matches_add_at_bit_for_bit(shape, axis, index_shape, dtype):
    index = RNG.integers(-shape[axis], shape[axis], index_shape)
    index.reshape(-1)[:5] = index.reshape(-1)[0]  # one index repeated
    start = _random(shape, dtype)
    values = _random((*shape[:axis], *index_shape, *shape[axis + 1:]), dtype)
    key = (slice(None),) * axis + (index,)
    want = start.copy()
    np.add.at(want, key, values)
    got = start.copy()
    status = _status()
    scatter_call(got, values, index, axis, accumulate=True, status=status)()
    assert status[0] == 0 and got.tobytes() == want.tobytes()
    row = values[(slice(None),) * axis + (0,)]  # one value row for every index: broadcast
    want, got = start.copy(), start.copy()
    np.add.at(want, key, np.broadcast_to(np.expand_dims(row, axis), values.shape))
    scatter_call(got, np.expand_dims(row, axis), index, axis, accumulate=True, status=status)()
    assert got.tobytes() == want.tobytes()
    if len(index_shape) > 1:  # the broadcast rows do not merge into one axis: a copy
        assert scatter_call(got, np.expand_dims(row, axis), index, axis, True,
                            fixed=True) is None


def test_accumulating_scatters_without_a_native_form_are_declined():
    out = np.zeros((4, 3), np.float16)  # adds f32, f64, i32, i64
    assert scatter_call(out, np.ones((2, 3), np.float16), np.array([0, 1]), 0, True) is None
    out = np.zeros((4, 3), np.float32)
    assert scatter_call(out, np.ones((2, 3), np.float64), np.array([0, 1]), 0, True) is None
    assert scatter_call(out, np.ones((3, 3), np.float32), np.array([0, 1]), 0, True) is None
    assert scatter_call(out, np.ones((2, 3), np.float32), np.array([0, 1], np.int32), 0, True,
                        fixed=True) is None  # the index would be a copy
    status = _status()
    scatter_call(out, np.ones((2, 3), np.float32), np.array([1, 4]), 0, True, status)()
    assert status[0] == 1 and out[1].tolist() == [1, 1, 1] and out.sum() == 3


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_picks_rows(axis):
    table = _random((6, 5, 4), np.float64)
    index = RNG.integers(-table.shape[axis], table.shape[axis], 9).astype(np.int64)
    out = np.empty(np.take(table, index, axis=axis).shape, table.dtype)
    copy_call(out, table, index=index, axis=axis, side="src", status=_status())()
    np.testing.assert_array_equal(out, np.take(table, index, axis=axis))


def test_an_index_out_of_range_sets_the_status_and_writes_nothing_there():
    table = _random((10, 4), np.float32)
    out = np.zeros((3, 4), np.float32)
    status = _status()
    copy_call(out, table, index=np.array([2, 10, -11], np.int64), axis=0, side="src",
              status=status)()
    assert status[0] == 1
    np.testing.assert_array_equal(out[0], table[2])
    assert not out[1:].any()
    cache = np.zeros((2, 8, 3), np.float32)
    status = _status()
    copy_call(cache, np.ones((2, 1, 3), np.float32), index=np.array([8], np.int64), axis=1,
              side="dst", status=status)()
    assert status[0] == 1 and not cache.any()


def test_copies_without_a_native_form_are_declined():
    a = np.zeros((2, 3), np.float32)
    assert copy_call(a, np.zeros((2, 3), np.float64)) is None  # element sizes differ
    assert copy_call(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)) is None
    deep = np.zeros((1,) * (MAX_RANK + 1) + (2,) * 0, np.float32)
    assert copy_call(deep, deep.copy()) is not None  # size-1 dims coalesce away
    index = np.array([0], np.int32)
    assert copy_call(a, a[:1], index=index, axis=0, side="dst") is None  # int32 index
    assert copy_call(a, a[:1], index=np.array([0], np.int64), axis=0, side="dst") is None
