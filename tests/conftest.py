"""Suite-wide setup: a private tilefold cache, strict mode, hypothesis profiles, and speed
tests left out unless asked for.

The suite runs strict (`TILEFOLD_STRICT=1`): a kernel method that fails, the reference
interpreter taking over, or PyTorch running part of a compiled graph is a `FallbackError`, not a
quiet pass. A test that exercises a fallback on purpose asks for the `allow_fallback` fixture.

Profiles: "ci" (the default; derandomized, modest example counts, no deadline on shared
machines) and "dev" (random seeds, more examples): `pytest --hypothesis-profile=dev`.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=30,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci")

_CACHE_DIR = tempfile.mkdtemp(prefix="tilefold-test-cache-")


def pytest_configure(config) -> None:
    """Point TILEFOLD_CACHE_DIR at a fresh folder and turn strict mode on, before any test (or
    import) can read them."""
    os.environ["TILEFOLD_CACHE_DIR"] = _CACHE_DIR
    os.environ["TILEFOLD_STRICT"] = "1"


@pytest.fixture
def allow_fallback(monkeypatch):
    """Strict mode off for one test that exercises a fallback on purpose."""
    monkeypatch.delenv("TILEFOLD_STRICT", raising=False)


def pytest_collection_modifyitems(config, items) -> None:
    """Deselect tests marked `timing` (speed thresholds a busy host fails) unless
    TILEFOLD_TIMING_TESTS=1 or a `-m` expression names them."""
    if os.environ.get("TILEFOLD_TIMING_TESTS") == "1" or "timing" in config.option.markexpr:
        return
    timing = [item for item in items if item.get_closest_marker("timing")]
    if timing:
        config.hook.pytest_deselected(items=timing)
        items[:] = [item for item in items if not item.get_closest_marker("timing")]


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)
