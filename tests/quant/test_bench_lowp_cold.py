"""`tilefold bench lowp --cold`: GEMV weights rotate through copies that together exceed L3."""

from __future__ import annotations

from tilefold.cli.bench_lowp import _copies, _rotating
from tilefold.target import host_target


def test_cold_copies_fill_l3_twice_and_hot_uses_one():
    l3 = host_target().l3_bytes
    for nbytes in (1 << 20, 64 << 20, 3 * l3):
        copies = _copies(nbytes, cold=True)
        assert (copies * nbytes >= 2 * l3 and (copies - 1) * nbytes < 2 * l3) or copies == 1
        assert _copies(nbytes, cold=False) == 1


def test_rotation_calls_each_weight_once_first_then_cycles():
    seen = []
    call = _rotating(seen.append, ["a", "b", "c"])
    assert seen == ["a", "b", "c"]  # warm-up: every weight's layout and plan built
    for _ in range(4):
        call()
    assert seen[3:] == ["a", "b", "c", "a"]
