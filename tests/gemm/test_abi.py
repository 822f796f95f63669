"""The shared call ABI (codegen/llvm/gemm/abi.py) both ways: entries reading the data pointers out
of NumPy array objects, and taking raw pointers (when CPython's object layout is unknown), for
every module family that uses it, against float64 NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.codegen.llvm.gemm import abi, gemm_module, make_plan
from tilefold.codegen.llvm.gemm import plan as gemm_plan
from tilefold.codegen.llvm.gemm.driver import Param
from tilefold.codegen.llvm.gemm.gemv import GemvParam
from tilefold.codegen.llvm.lowp import dotpack, weight_only
from tilefold.quant import dequantize, matmul_lowp, quantize, quantized_matmul
from tilefold.quant.accuracy import matmul_bound
from tilefold.target import host_target

V3 = host_target("x86-64-v3")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(77)


@pytest.fixture(params=["objects", "raw pointers"])
def data_offset(request, monkeypatch):
    """Run the test with the detected offset, and again as if it were unknown (-1)."""
    if request.param == "raw pointers":
        for module in (abi, gemm_plan, dotpack, weight_only):
            monkeypatch.setattr(module, "DATA_OFFSET", -1)
    return request.param


@pytest.mark.parametrize("m, n, k", [(1, 37, 29), (23, 1, 40), (45, 70, 33)])
def test_f32_gemm_and_gemv(rng, data_offset, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    plan = make_plan(gemm_module(V3), a, b, c, 0, 2)
    slot = GemvParam.DATA_OFFSET if isinstance(plan, gemm_plan.GemvPlan) else Param.DATA_OFFSET
    assert (plan.params[slot] == -1) == (data_offset == "raw pointers")
    assert isinstance(plan, gemm_plan.GemvPlan) == (1 in (m, n))
    plan(a, b, c)
    exact = a.astype(np.float64) @ b
    assert (np.abs(c - exact) <= matmul_bound(a, b)).all()


def test_dot_gemm(rng, data_offset):
    a = rng.integers(-128, 128, (13, 91)).astype(np.int8)
    b = rng.integers(-128, 128, (91, 37)).astype(np.int8)
    assert np.array_equal(matmul_lowp(a, b, target=V3, threads=2),
                          a.astype(np.int64) @ b.astype(np.int64))


def test_weight_only_gemv(rng, data_offset):
    qw = quantize(rng.standard_normal((128, 40)).astype(np.float32), "int4")
    x = rng.standard_normal((3, 128)).astype(np.float32)
    w = dequantize(qw, "f64")
    y = quantized_matmul(x, qw, target=V3, threads=2)
    assert (np.abs(y - x.astype(np.float64) @ w) <= matmul_bound(x, w)).all()
