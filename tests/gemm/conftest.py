"""GEMM tests compile into a private kernel cache, so they never read or pollute the user's;
`store` gives one test an empty tuning folder of its own."""

import pytest

from tilefold.codegen.gemm import tuned


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEFOLD_CACHE_DIR", str(tmp_path_factory.mktemp("tilefold-cache")))
    yield
    mp.undo()


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A private, empty tuning folder for one test: the path of its store."""
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    tuned.forget()
    yield tuned.store_path()
    tuned.forget()
