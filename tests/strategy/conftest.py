"""Each strategy test module gets its own tilefold cache (tuning database, kernels, peaks)."""

from __future__ import annotations

import pytest

from tilefold.strategy import register_builtin_methods


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """A fresh $TILEFOLD_CACHE_DIR per module, so databases never leak between tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEFOLD_CACHE_DIR", str(tmp_path_factory.mktemp("tilefold-cache")))
    mp.delenv("TILEFOLD_TUNE", raising=False)
    register_builtin_methods()
    yield
    mp.undo()
