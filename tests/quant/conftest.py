"""Shared set-up for the low-precision tests: a private kernel cache and seeded data."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

# tests/conftest.py already isolates the cache for a whole-suite run; this covers running the
# folder alone from elsewhere.
os.environ.setdefault("TILEFOLD_CACHE_DIR", tempfile.mkdtemp(prefix="tilefold-quant-cache-"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
