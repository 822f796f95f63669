"""GPU-backend tests run Triton's interpreter on CPU torch tensors (and compile sm_90 PTX in a
child process); kernels and generated source go to a private cache folder.

TRITON_INTERPRET=1 is set only while a test of this folder runs: `triton.jit` reads it when a
kernel's source is loaded, and generated kernels call no `@triton.jit` function of Triton's own
library, so it does not matter how Triton was first imported by the rest of the suite."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEFOLD_CACHE_DIR", str(tmp_path_factory.mktemp("tilefold-cache")))
    yield
    mp.undo()
