"""GPU-backend tests run Triton's interpreter on CPU torch tensors (and compile sm_90 PTX in a
child process), or with TILEFOLD_GPU_DEVICE=1 the same tests compiled on CUDA tensors
(`placement.py`); kernels and generated source go to a private cache folder.

TRITON_INTERPRET=1 is set only while a test of this folder runs under the interpreter (and
removed on the device): `triton.jit` reads it when a kernel's source is loaded, and generated
kernels call no `@triton.jit` function of Triton's own library, so it does not matter how
Triton was first imported by the rest of the suite."""

from __future__ import annotations

import os

import pytest

from tests.gpu.placement import ON_DEVICE, cuda_problem, device_for, skip_reason


def pytest_configure(config) -> None:
    """Register the markers; with TILEFOLD_GPU_DEVICE=1 and no usable CUDA device, stop the
    run with a usage error before any test (never a quiet run under the interpreter)."""
    config.addinivalue_line("markers", "interpreter_only(why): holds under Triton's "
                            "interpreter only; skipped with TILEFOLD_GPU_DEVICE=1")
    config.addinivalue_line("markers", "device_only(why): needs compiled kernels on a CUDA "
                            "device (TILEFOLD_GPU_DEVICE=1); skipped under the interpreter")
    try:
        device_for(os.environ, cuda_problem)
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_runtest_setup(item) -> None:
    marks = {m.name: m.args[0] for m in item.iter_markers()
             if m.name in ("interpreter_only", "device_only")}
    reason = skip_reason(ON_DEVICE, marks)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    if ON_DEVICE:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEFOLD_CACHE_DIR", str(tmp_path_factory.mktemp("tilefold-cache")))
    yield
    mp.undo()
