"""`by_rows`: every row in exactly one piece, pieces in row order, on the threads asked for."""

import itertools
import threading

import numpy as np
import pytest

from tilefold.runtime import numpy_threads
from tilefold.runtime.numpy_threads import by_rows


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [0, 1, 2, 7, 97, 1000])
@pytest.mark.parametrize("row_elements", [1, 13, 1 << 20])
def test_rows_are_covered_once_in_order(monkeypatch, threads, rows, row_elements):
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", str(threads))
    monkeypatch.setattr(numpy_threads, "PIECE_ELEMENTS", 64)
    seen = np.zeros(rows, np.int64)

    def work(lo, hi):
        seen[lo:hi] += 1
        return lo, hi

    pieces = by_rows(rows, work, row_elements=row_elements)
    assert (seen == 1).all()
    starts = [lo for lo, _ in pieces]
    assert starts == sorted(starts) and all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    step = max(1, 64 // row_elements)  # rows a piece: about PIECE_ELEMENTS elements
    assert len(pieces) == max(1, -(-rows // step))


def test_pieces_run_on_the_threads_asked_for(monkeypatch):
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "3")
    monkeypatch.setattr(numpy_threads, "PIECE_ELEMENTS", 1)
    barrier = threading.Barrier(3, timeout=30)  # only passes when three pieces run at once

    def work(lo, hi):
        barrier.wait()
        return threading.get_ident()

    assert len(set(by_rows(3, work))) == 3


def test_an_error_in_a_piece_reaches_the_caller(monkeypatch):
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "2")
    monkeypatch.setattr(numpy_threads, "PIECE_ELEMENTS", 1)

    def work(lo, hi):
        if lo == 3:
            raise ValueError("piece 3")
        return lo

    with pytest.raises(ValueError, match="piece 3"):
        by_rows(4, work)
