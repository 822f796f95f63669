"""GEMM tests compile into a private kernel cache, so they never read or pollute the user's."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEFOLD_CACHE_DIR", str(tmp_path_factory.mktemp("tilefold-cache")))
    yield
    mp.undo()
