"""The fusion pass asks the backend's policy what its kernels hold: every backend has one (the
CPU's rules unless it gives its own), `fusion{backend=NAME}` follows it, and a different policy
changes what fuses (and the interpreter's answer does not)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tilefold.codegen.backend import BACKENDS
from tilefold.errors import PassError, TilefoldError
from tilefold.ir import interpret, parse_module, verify
from tilefold.passes import run_pipeline
from tilefold.passes.fusion_policy import (
    CPU_FUSION,
    FUSION_POLICIES,
    fusion_policy,
    register_fusion_policy,
)

TEXT = """func @main(%x: f64[5,3], %w: f64[5,4], %b: f64[4]) -> (f64[3,4]) {
  %t = transpose(%x) {perm = [1,0]} : f64[3,5]
  %y = matmul(%t, %w) : f64[3,4]
  %z = add(%y, %b) : f64[3,4]
  %s = softmax(%z) : f64[3,4]
  return(%s)
}"""


def groups(module) -> list[list[str]]:
    """The op names of each fused region, in order."""
    return [[o.name for o in op.regions[0].ops if o.name != "yield"]
            for op in module["main"].ops if op.name == "fused"]


def test_every_backend_gives_the_fusion_pass_its_policy() -> None:
    assert set(BACKENDS) <= set(FUSION_POLICIES)
    for name, backend in BACKENDS.items():
        assert fusion_policy(name) is backend.fusion
    assert fusion_policy("llvm") is CPU_FUSION  # the CPU's rules, the pass's default


@pytest.fixture
def policies(monkeypatch: pytest.MonkeyPatch) -> dict:
    table = dict(FUSION_POLICIES)
    monkeypatch.setattr("tilefold.passes.fusion_policy.FUSION_POLICIES", table)
    return table


def test_a_backend_s_policy_decides_what_its_kernels_hold(policies: dict) -> None:
    register_fusion_policy("no-prologues", dataclasses.replace(CPU_FUSION,
                                                               prologue_ops=frozenset()))
    register_fusion_policy("no-gemms", dataclasses.replace(CPU_FUSION, compute_ops=frozenset()))
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s) for s in ((5, 3), (5, 4), (4,))]
    (want,) = interpret(parse_module(TEXT), *arrays)
    seen = {}
    for backend in ("llvm", "no-prologues", "no-gemms"):
        module = verify(parse_module(TEXT))
        run_pipeline(module, f"fusion{{backend={backend}}}")
        verify(module)
        seen[backend] = groups(module)
        (got,) = interpret(module, *arrays)
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
    assert seen["llvm"] == [["transpose", "matmul", "add", "softmax"]]
    assert seen["no-prologues"] == [["matmul", "add", "softmax"]]  # the transpose: a view step
    assert seen["no-gemms"] == [["add", "softmax"]]  # the matmul: a step of its own


def test_an_unknown_backend_or_a_second_policy_is_an_error(policies: dict) -> None:
    module = verify(parse_module(TEXT))
    with pytest.raises(PassError, match=r"no backend fusion policy named 'tpu'.*llvm"):
        run_pipeline(module, "fusion{backend=tpu}")
    register_fusion_policy("llvm", CPU_FUSION)  # the same one again: nothing changes
    with pytest.raises(TilefoldError, match="'llvm' has a fusion policy already"):
        register_fusion_policy("llvm", dataclasses.replace(CPU_FUSION, compute_ops=frozenset()))
