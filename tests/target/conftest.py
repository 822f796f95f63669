"""Every test here uses a private kernel/peaks cache, never the user's ~/.cache/tilefold."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Point TILEFOLD_CACHE_DIR at a temporary folder for the session (subprocesses inherit)."""
    previous = os.environ.get("TILEFOLD_CACHE_DIR")
    path = tmp_path_factory.mktemp("tilefold-cache")
    os.environ["TILEFOLD_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("TILEFOLD_CACHE_DIR", None)
    else:
        os.environ["TILEFOLD_CACHE_DIR"] = previous
