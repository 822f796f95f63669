"""The pool of large aligned buffers: a block comes back only when no view of its array lives."""

import dataclasses
import gc
import os
from pathlib import Path

import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold.runtime import buffers
from tilefold.runtime.buffers import ALIGN, POOL_MIN, aligned_empty, idle_bytes, release_pages


@pytest.mark.parametrize("shape, dtype", [((0,), np.float32), ((7, 3), np.int8),
                                          ((POOL_MIN // 4 + 13,), np.float32),
                                          ((3, 517, 1031), np.float64)])
def test_arrays_are_aligned_contiguous_and_writable(shape, dtype):
    a = aligned_empty(shape, dtype)
    assert a.shape == shape and a.dtype == dtype
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.size == 0 or a.ctypes.data % ALIGN == 0  # an empty array points nowhere
    a[...] = 3
    assert np.all(a == 3)


def test_a_block_is_reused_only_after_every_view_died():
    gc.collect()
    a = aligned_empty((1024, 1024), np.float32)
    address = a.ctypes.data
    view = a[5:, 1:]
    view[...] = 7.0
    del a
    b = aligned_empty((1024, 1024), np.float32)  # the view keeps a's block
    assert not np.shares_memory(b, view) and b.ctypes.data != address
    b[...] = -1.0
    assert np.all(view == 7.0)
    del view
    c = aligned_empty((1024, 1024), np.float32)
    assert c.ctypes.data == address
    assert not np.shares_memory(b, c)


def test_small_arrays_are_not_pooled():
    before = idle_bytes()
    a = aligned_empty((POOL_MIN // 8,), np.float32)
    del a
    assert idle_bytes() == before


def test_idle_blocks_are_capped(monkeypatch):
    monkeypatch.setattr(buffers, "POOL_IDLE_BYTES", 3 * POOL_MIN)
    arrays = [aligned_empty((POOL_MIN // 4 * n,), np.float32) for n in (1, 2, 3, 4)]
    del arrays
    aligned_empty((1,), np.uint8)
    assert idle_bytes() > 0
    aligned_empty((POOL_MIN,), np.uint8)  # files the returned blocks, trims to the cap
    assert idle_bytes() <= 3 * POOL_MIN


def test_a_streamed_output_kept_alive_is_not_overwritten_by_the_next_call():
    """A host whose L3 is 64 KiB streams a 2 MiB softmax into pooled outputs: the first
    call's output, still alive, keeps its values through the second call."""
    from tilefold.codegen.kernel import compile_group
    from tilefold.ir import functional as F
    from tilefold.ir import trace
    from tilefold.target import host_target

    shape = (512, 1024)
    small = dataclasses.replace(host_target(), l3_bytes=64 << 10)
    run = compile_group(trace(lambda v: F.softmax(v, axis=-1), ("x", "f32", shape))["main"],
                        small)
    rng = np.random.default_rng(3)
    x1, x2 = (rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
    (y1,) = run(x1)
    assert type(y1.base).__name__ == "_Lease"
    (y2,) = run(x2)
    del y2
    (y3,) = run(x2)
    for x, y in ((x1, y1), (x2, y3)):
        e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        assert_close(y, e / e.sum(-1, keepdims=True), dtype="f32", reduced=shape[-1])


def _resident_kib(path) -> int:
    """Resident KiB of this process's mappings of the file at `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's smaps")
def test_released_pages_leave_the_process_and_read_back_the_same(tmp_path):
    """A memory-mapped array's pages, once read, count in the process; released, they do not,
    and reading the array again gives its values (faulted back in from the file). An array in
    anonymous memory is left as it is."""
    want = np.random.default_rng(5).standard_normal((1 << 20,)).astype(np.float32)  # 4 MiB
    path = tmp_path / "w.npy"
    np.save(path, want)
    mapped = np.load(path, mmap_mode="r")[1:].reshape(-1, 1)  # a view of the mapping
    assert float(mapped.sum()) == pytest.approx(float(want[1:].sum()), rel=1e-4)
    assert _resident_kib(path) >= 4000
    plain = want.copy()
    release_pages(mapped, plain, None)
    assert _resident_kib(path) < 64
    np.testing.assert_array_equal(mapped[:, 0], want[1:])
    np.testing.assert_array_equal(plain, want)


def test_mapped_file_names_the_region_an_array_views(tmp_path):
    from tilefold.runtime.buffers import mapped_file

    a = np.arange(60, dtype=np.float32).reshape(10, 6)
    np.save(tmp_path / "a.npy", a)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    path, offset, size = mapped_file(mapped)
    assert os.path.samefile(path, tmp_path / "a.npy") and size == a.nbytes
    rows = mapped_file(mapped[2:5].view(np.int32))
    assert rows[1:] == (offset + 2 * 24, 3 * 24)
    raw = np.fromfile(tmp_path / "a.npy", np.uint8)[rows[1]:rows[1] + rows[2]]
    np.testing.assert_array_equal(raw.view(np.float32).reshape(3, 6), a[2:5])
    assert mapped_file(mapped[:, 1:]) is None  # not one contiguous region
    assert mapped_file(a) is None and mapped_file(np.array(mapped)) is None
