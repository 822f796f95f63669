"""Where tests/gpu run (`placement.py`, `conftest.py`): Triton's interpreter on the CPU unless
TILEFOLD_GPU_DEVICE=1 asks for the CUDA device; asking for one that is not there stops pytest
with a usage error naming what is missing; the markers skip a test where it cannot hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.placement import (
    DEVICE,
    ENV,
    ON_DEVICE,
    cuda_problem,
    device_for,
    skip_reason,
    wants_device,
)

ROOT = Path(__file__).resolve().parents[2]


def _unasked() -> str | None:
    raise AssertionError("probed for a CUDA device nobody asked for")


def test_the_interpreter_unless_the_device_is_asked_for():
    for environ in ({}, {ENV: "0"}, {ENV: ""}, {ENV: " 0 "}):
        assert not wants_device(environ) and device_for(environ, _unasked) == "cpu"
    assert wants_device({ENV: "1"}) and device_for({ENV: "1"}, lambda: None) == "cuda"


def test_asking_for_a_missing_device_is_an_error_saying_what_to_do():
    with pytest.raises(RuntimeError, match=r"TILEFOLD_GPU_DEVICE=1 runs tests/gpu compiled on a "
                       r"CUDA device, but torch 2.x sees no CUDA device; run on a machine with "
                       r"an NVIDIA GPU, or unset TILEFOLD_GPU_DEVICE"):
        device_for({ENV: "1"}, lambda: "torch 2.x sees no CUDA device")


def test_the_probe_names_what_is_missing(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_problem().startswith(f"torch {torch.__version__}")
    assert cuda_problem().endswith("sees no CUDA device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "triton", None)  # any import of it fails
    assert cuda_problem().startswith("Triton cannot be imported")
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cuda_problem().startswith("torch cannot be imported")


def test_markers_skip_where_their_test_cannot_hold():
    assert skip_reason(False, {}) is None and skip_reason(True, {}) is None
    only = {"interpreter_only": "the bf16 widening"}
    assert skip_reason(False, only) is None
    assert skip_reason(True, only) == (
        "interpreter-only: tests Triton's interpreter's own behaviour (the bf16 widening); "
        "TILEFOLD_GPU_DEVICE=1 runs compiled kernels")
    device = {"device_only": "checks a compiled binary"}
    assert skip_reason(True, device) is None
    assert skip_reason(False, device) == ("device-only: checks a compiled binary; needs "
                                          "TILEFOLD_GPU_DEVICE=1 and a CUDA device")


def test_this_run_is_where_it_was_asked_to_be():
    assert device_for(os.environ, cuda_problem) == DEVICE
    assert wants_device(os.environ) == ON_DEVICE
    # conftest's autouse fixture: the interpreter set for CPU runs, removed on the device
    assert os.environ.get("TRITON_INTERPRET") == (None if ON_DEVICE else "1")


def test_pytest_stops_with_a_usage_error_when_the_device_is_missing():
    env = {**os.environ, ENV: "1", "CUDA_VISIBLE_DEVICES": ""}  # hides a GPU if there is one
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/gpu/test_triton_source.py"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "TILEFOLD_GPU_DEVICE=1 runs tests/gpu compiled on a CUDA device, but " in run.stderr
    assert "sees no CUDA device" in run.stderr or "cannot be imported" in run.stderr
    assert "passed" not in run.stdout
