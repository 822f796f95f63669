"""The memory a recorded step program points into, as numbered buffers, so that every address
can be written as (buffer, offset) and placed again in another process.

Arrays are registered with a kind: "input" and "output" (the call's arrays), "workspace"
(the plan's intermediates and scratch: allocated empty at load), "data" (parameter blocks, a
kernel's own arrays: their bytes are saved), "constant" (a graph's constant: data whose bytes
are the model's) and "status" (the word a native copy sets on an index out of range). Arrays
whose memory overlaps become one buffer; a data array inside another kind's buffer is a view
of it. Two kinds other than data sharing memory are refused, and so is a constant sharing
memory with anything but data (its bytes would not be saved).
"""

from __future__ import annotations

import bisect
import ctypes
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.array_utils import byte_bounds

from tilefold.errors import UnsupportedError

_RANK = {"data": 0, "workspace": 1, "status": 1, "input": 1, "output": 1}
# Plausible user-space addresses (x86-64 and AArch64 Linux: below 2**47). A word of a
# parameter block in this range that points into no buffer refuses the export.
_USER_LOW, _USER_HIGH = 1 << 32, 1 << 47


@dataclass
class Buffer:
    kind: str
    start: int
    end: int
    index: int = -1  # the input or output number
    scan: bool = False  # may hold addresses (an int64 parameter block)
    arrays: list = field(default_factory=list)  # keep the memory alive while exporting
    fixed: bool = False  # holds a constant of the graph: its bytes are the model's

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def content(self) -> bytes:
        return ctypes.string_at(self.start, self.nbytes) if self.nbytes else b""


def extent(array: np.ndarray) -> tuple[int, int]:
    """The bytes of the allocation `array` views (its outermost NumPy base's)."""
    base = array
    while isinstance(base.base, np.ndarray):
        base = base.base
    low, high = byte_bounds(base)
    return low, high


class Memory:
    """Registered arrays, then (`seal`) the buffers they make and address lookups."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, int, str, int, bool, np.ndarray]] = []
        self.buffers: list[Buffer] = []
        self._starts: list[int] = []

    def add(self, array: np.ndarray, kind: str, index: int = -1, scan: bool = False) -> None:
        """Register `array`; `scan`: it may hold addresses (a kernel's int64 parameter block,
        never a constant of the graph, whose values are the model's)."""
        low, high = extent(array)
        self._pending.append((low, high, kind, index, scan and array.dtype == np.int64, array))

    def seal(self) -> None:
        """Merge overlapping arrays into buffers, in address order."""
        for low, high, kind, index, scan, array in sorted(self._pending, key=lambda p: p[0]):
            fixed, kind = kind == "constant", "data" if kind == "constant" else kind
            last = self.buffers[-1] if self.buffers else None
            if last is None or low >= last.end:
                self.buffers.append(Buffer(kind, low, high, index, scan, [array], fixed))
                continue
            two_kinds = bool(_RANK[kind] and _RANK[last.kind]) and \
                (kind, index) != (last.kind, last.index)
            constant_shared = (fixed or last.fixed) and bool(_RANK[kind] or _RANK[last.kind])
            if two_kinds or constant_shared:
                raise UnsupportedError(
                    f"cannot export: memory shared by a {'constant' if last.fixed else last.kind}"
                    f" and a {'constant' if fixed else kind} buffer")
            last.fixed = last.fixed or fixed
            if _RANK[kind] > _RANK[last.kind]:
                last.kind, last.index = kind, index
            last.end = max(last.end, high)
            last.scan = last.scan or scan
            last.arrays.append(array)
        for b in self.buffers:
            b.scan = b.scan and b.kind == "data"
            aligned = [a.ctypes.data for a in b.arrays
                       if a.ctypes.data % 64 == 0 and 0 < a.ctypes.data - b.start < 64]
            if b.kind == "workspace" and aligned:
                # Scratch aligned inside a larger allocation: the buffer starts at the aligned
                # array (the bytes before it are padding nothing refers to), so offsets keep
                # its alignment (the loaders align each buffer) and do not depend on where
                # malloc put the memory (programs recorded at two sizes then fit one
                # another, `aot/symbolic.py`).
                b.start = min(aligned)
        self._starts = [b.start for b in self.buffers]

    def find(self, address: int) -> tuple[int, int] | None:
        """(buffer number, offset) of `address`, or None outside every buffer."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address <= self.buffers[i].end:
            return i, address - self.buffers[i].start
        return None

    def pointer_words(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Words of scanned buffers holding an address inside a buffer: (where, to)."""
        found = []
        for number, b in enumerate(self.buffers):
            if not b.scan:
                continue
            words = np.frombuffer(b.content(), np.int64, b.nbytes // 8)
            for i in np.flatnonzero((words >= _USER_LOW) & (words < _USER_HIGH)):
                to = self.find(int(words[i]))
                if to is None:
                    raise UnsupportedError(
                        f"cannot export: a parameter block holds the address {int(words[i]):#x}"
                        ", which is in no buffer of the program (memory a kernel keeps out of "
                        "sight); that kernel cannot be exported yet")
                found.append(((number, 8 * int(i)), to))
        return found
