"""The caller runs its share of a region pinned, and gets its own CPU mask back afterwards."""

from __future__ import annotations

import os

import pytest

from tilefold.runtime.thread_pool import thread_pool


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_caller_mask_is_restored_after_regions():
    before = os.sched_getaffinity(0)
    pool = thread_pool()
    pool.region_cost(nthreads=2, repeats=100)
    assert os.sched_getaffinity(0) == before
    narrowed = set(sorted(before)[1:])  # a mask that excludes the pool's cpus[0]
    os.sched_setaffinity(0, narrowed)
    try:
        pool.region_cost(nthreads=2, repeats=100)
        assert os.sched_getaffinity(0) == narrowed
    finally:
        os.sched_setaffinity(0, before)
