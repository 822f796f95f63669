"""The backend seam below the kernel IR: the registry, what the LLVM backend supports, and the
kernel driver and auto-codegen method going through it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold.codegen.backend import BACKENDS, Backend, get_backend, register_backend
from tilefold.codegen.kernel import compile_group, lower_group
from tilefold.errors import TilefoldError, UnsupportedError
from tilefold.ir import functional as F
from tilefold.ir import trace
from tilefold.target import gpu_target, host_target


def _group():
    return trace(lambda x, b: F.exp(x - b) * F.sigmoid(x), ("x", "f32", ("n", "m")),
                 ("b", "f32", ("m",)))


GROUP = _group()


def _inputs():
    rng = np.random.default_rng(11)
    return rng.standard_normal((7, 37)).astype(np.float32), rng.standard_normal(37).astype(
        np.float32)


def _want(x, b):
    x64, b64 = x.astype(np.float64), b.astype(np.float64)
    return np.exp(x64 - b64) / (1 + np.exp(-x64))


class Refusing(Backend):
    name = "test-refusing"

    def supports(self, kernel, target):
        return "refuses every kernel (a test backend)"

    def fingerprint(self):
        return "test"

    def compile(self, kernel, schedule, target):
        raise AssertionError("compile must not be reached when supports refuses")

    def assembly(self, kernel, schedule, target):
        return ""


@pytest.fixture
def refusing():
    register_backend(Refusing)
    yield BACKENDS["test-refusing"]
    BACKENDS.pop("test-refusing")


def test_lookup_by_name_and_unknown_names():
    assert get_backend("llvm").name == "llvm"
    with pytest.raises(TilefoldError, match=r"no code generation backend named 'ptx'.*llvm"):
        get_backend("ptx")


def test_a_name_registers_once(refusing):
    with pytest.raises(TilefoldError, match="registered already"):
        register_backend(Refusing)


def test_llvm_supports_cpu_targets_and_its_dtypes_only():
    kernel, _ = lower_group(GROUP["main"])
    llvm = get_backend("llvm")
    assert llvm.supports(kernel, host_target()) is None
    assert "not a CPU target" in llvm.supports(kernel, gpu_target("h100"))
    wide = dataclasses.replace(kernel, buffers=tuple(dataclasses.replace(b, dtype="f64")
                                                     for b in kernel.buffers))
    assert "not f64" in llvm.supports(wide, host_target())


def test_the_driver_runs_what_the_llvm_backend_compiles():
    x, b = _inputs()
    (got,) = compile_group(GROUP["main"], backend="llvm")(x, b)
    assert_close(got, _want(x, b), dtype="f32")
    kernel, schedule = lower_group(GROUP["main"])
    executable = get_backend("llvm").compile(kernel, schedule, host_target())
    assert f"@\"{kernel.name}.arrays\"" in executable.source() and executable.entry is not None


def test_the_driver_reports_a_backend_s_refusal(refusing):
    with pytest.raises(UnsupportedError, match="refuses every kernel"):
        compile_group(GROUP["main"], backend="test-refusing")(*_inputs())


def test_auto_codegen_says_why_when_no_backend_supports_the_group(monkeypatch, refusing):
    from tilefold.passes import run_pipeline
    from tilefold.strategy import METHODS, Problem, context

    module = _group()
    run_pipeline(module, "fusion")
    fused = next(op for op in module["main"].ops if op.name == "fused")
    problem = Problem.of(fused, [(7, 37), (37,)])
    method = METHODS["autocodegen.kernel"]
    (candidate,) = method.propose(problem, context())
    assert candidate.note == "llvm backend"
    monkeypatch.setitem(BACKENDS, "llvm", refusing)
    answer = method.propose(problem, context())
    assert "backend llvm: refuses every kernel" in answer
