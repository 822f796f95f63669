"""GPU-backend tests run Triton's interpreter on CPU torch tensors (and compile sm_90 PTX in a
child process); kernels and generated source go to a private cache folder.

Triton decides at import whether its own library functions are interpreted, so it is imported
here under TRITON_INTERPRET=1; the variable itself is set only while a test of this folder
runs, so the rest of the suite does not see it."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

if "triton" not in sys.modules and importlib.util.find_spec("triton") is not None:
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import triton
    import triton.language  # noqa: F401

    if _saved is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _saved


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    standard = sys.modules.get("triton.language.standard")
    if standard is not None and type(standard.cdiv).__name__ != "InterpretedFunction":
        pytest.fail("Triton was imported before tests/gpu/conftest.py without TRITON_INTERPRET=1;"
                    " its interpreter cannot run in this process (run tests/gpu on their own)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEFOLD_CACHE_DIR", str(tmp_path_factory.mktemp("tilefold-cache")))
    yield
    mp.undo()
