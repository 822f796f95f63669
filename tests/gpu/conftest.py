"""GPU-backend tests run Triton's interpreter on CPU torch tensors and compile for sm_90 on the
CPU; kernels and generated source go to a private cache folder."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is loaded


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEFOLD_CACHE_DIR", str(tmp_path_factory.mktemp("tilefold-cache")))
    yield
    mp.undo()
