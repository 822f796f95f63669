"""Host buffers for kernels: cache-line aligned, and large ones reused once their arrays die.

A fresh large array costs the kernel that fills it a page fault and a zeroed page per 4 KiB:
glibc maps every block past 32 MiB anew and unmaps it on free. On znver3 an rms_norm over
40 MiB ran at 4.9 GB/s into fresh outputs and 11.0 GB/s into a reused one (1 thread; 8.2 and
18.7 on 2). So a block of `POOL_MIN` bytes or more comes from a pool: the array it backs holds
a `_Lease` as its base (NumPy keeps that base alive while any view of the array lives), and
the lease's finalizer returns the block when the last view dies; a live array never shares
memory with another. At most `POOL_IDLE_BYTES` wait idle, the oldest dropped first (checked
when a block is next asked for).
"""

from __future__ import annotations

import math
import mmap
import threading
from collections import deque

import numpy as np

# Cache-line alignment for buffers the kernels stream (packed panels, workspaces, outputs).
ALIGN = 64
POOL_MIN = 1 << 20
POOL_IDLE_BYTES = 512 << 20
_PAGE = 1 << 16  # pooled sizes are rounded up to this, so near sizes share blocks

_lock = threading.Lock()
_idle: list[np.ndarray] = []  # raw blocks no array uses, oldest first
# A finalizer may run anywhere (in another thread, or in a collection inside `_acquire`), so it
# only appends here (atomic, no lock); `_acquire` files the returned blocks under the lock.
_returned: deque[np.ndarray] = deque()


class _Lease:
    """Base object of a pooled array: NumPy reads the buffer from `__array_interface__`."""

    __slots__ = ("__array_interface__", "_block")

    def __init__(self, block: np.ndarray, shape: tuple[int, ...], dtype: np.dtype):
        self._block = block
        start = -block.ctypes.data % ALIGN
        self.__array_interface__ = {"data": (block.ctypes.data + start, False),
                                    "shape": shape, "typestr": dtype.str, "version": 3}

    def __del__(self):
        _returned.append(self._block)


def _acquire(size: int) -> np.ndarray:
    """The newest idle block of `size` bytes, or a new one."""
    with _lock:
        while _returned:
            _idle.append(_returned.popleft())
        while sum(block.nbytes for block in _idle) > POOL_IDLE_BYTES:
            _idle.pop(0)
        for i in range(len(_idle) - 1, -1, -1):
            if _idle[i].nbytes == size:
                return _idle.pop(i)
    return np.empty(size, np.uint8)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary (NumPy
    only promises 16); from the pool when it is `POOL_MIN` bytes or more."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < POOL_MIN:
        raw = np.empty(nbytes + ALIGN, np.uint8)
        start = -raw.ctypes.data % ALIGN
        return raw[start:start + nbytes].view(dtype).reshape(shape)
    block = _acquire(-(-(nbytes + ALIGN) // _PAGE) * _PAGE)
    return np.asarray(_Lease(block, shape, dtype))


def idle_bytes() -> int:
    """Bytes of pooled blocks no array uses now (filed or just returned)."""
    with _lock:
        return sum(block.nbytes for block in [*_idle, *_returned])


def release_pages(*arrays: np.ndarray | None) -> None:
    """Drop the resident pages of arrays mapped from files (`np.load(mmap_mode="r")`, GGUF
    tensors): once a kernel holds its own layout of a weight, the source's pages need not stay
    in this process's memory. Reading such an array again faults its pages back in from the
    file (from the page cache, usually); arrays not backed by a file are left alone."""
    for array in arrays:
        base = array
        while base is not None and not isinstance(base, mmap.mmap):
            base = getattr(base, "base", None)
        if base is not None and not base.closed and hasattr(mmap, "MADV_DONTNEED"):
            base.madvise(mmap.MADV_DONTNEED)


def mapped_file(array: np.ndarray) -> tuple[str, int, int] | None:
    """(path, byte offset, bytes) of the file region `array` is a C-contiguous view of, where it
    is memory-mapped from a file (`np.load(mmap_mode="r")`), else None."""
    base = array  # the memmap over the mapping itself (a memmap's slices are memmaps too)
    while isinstance(base, np.ndarray) and not (
            isinstance(base, np.memmap) and isinstance(base.base, mmap.mmap)):
        base = base.base
    if not isinstance(base, np.memmap) or base.filename is None or \
            not array.flags.c_contiguous:
        return None
    start = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return base.filename, base.offset + start, array.nbytes
