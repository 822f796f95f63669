"""The exporter's memory map (`aot/memory.py`): arrays become buffers by the memory they
share, every address becomes (buffer, offset), and sharing that would lose bytes is refused."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.aot.memory import Memory
from tilefold.errors import UnsupportedError


def test_views_join_the_buffer_of_their_memory() -> None:
    x, w, block = np.zeros((4, 8), np.float32), np.ones(16, np.float32), np.zeros(4, np.int64)
    memory = Memory()
    memory.add(x, "input", 0)
    memory.add(x.T[1:], "data")  # a kernel's view of the input
    memory.add(w, "constant")
    memory.add(w[::2], "data")
    memory.add(block, "data", scan=True)
    memory.seal()
    kinds = sorted((b.kind, b.nbytes, b.fixed) for b in memory.buffers)
    assert kinds == [("data", 32, False), ("data", 64, True), ("input", 128, False)]
    number, offset = memory.find(x[2:].ctypes.data)
    assert memory.buffers[number].kind == "input" and offset == 2 * 8 * 4
    assert memory.find(x.ctypes.data + x.nbytes) == (number, x.nbytes)  # one past the end
    assert memory.find(np.zeros(3).ctypes.data) is None


def test_a_parameter_block_word_pointing_into_a_buffer_is_relocated() -> None:
    target, block = np.zeros(64, np.float32), np.zeros(4, np.int64)
    block[2] = target.ctypes.data + 12
    memory = Memory()
    memory.add(target, "workspace")
    memory.add(block, "data", scan=True)
    memory.seal()
    (where, to), = memory.pointer_words()
    assert memory.buffers[where[0]].kind == "data" and where[1] == 16
    assert memory.buffers[to[0]].kind == "workspace" and to[1] == 12


@pytest.mark.parametrize(("first", "second"), [("input", "output"), ("constant", "workspace"),
                                               ("output", "constant")])
def test_memory_shared_by_kinds_that_would_lose_bytes_is_refused(first, second) -> None:
    x = np.zeros(32, np.float32)
    memory = Memory()
    memory.add(x, first, 0)
    memory.add(x[4:], second, 1)
    with pytest.raises(UnsupportedError, match="memory shared by"):
        memory.seal()
