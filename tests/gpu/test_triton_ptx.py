"""Kernels compiled for sm_90 on the CPU (no GPU): the PTX loads global memory in 128-bit
vectors, touches no local memory, and ptxas reports no spills and shared memory within the
227 KB a Hopper block may use."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")

from tilefold.codegen.kernel import lower_group
from tilefold.codegen.triton.ptx import compile_ptx
from tilefold.codegen.triton.schedule import choose_gpu_schedule
from tilefold.errors import UnsupportedError
from tilefold.ir import functional as F
from tilefold.ir import trace
from tilefold.target import gpu_target

H200 = gpu_target("h200")


def _ptx(fn, *params):
    kernel, _ = lower_group(trace(fn, *params)["main"])
    return compile_ptx(kernel, choose_gpu_schedule(kernel, H200), H200)


def _check(report, vector_load: str) -> None:
    assert report.arch == "sm_90" and ".target sm_90" in report.ptx
    assert vector_load in set(re.findall(r"ld\.global[.\w]*", report.ptx)), report.summary()
    assert ".local" not in report.ptx and "ld.local" not in report.ptx
    assert report.spill_bytes == 0 and report.registers is not None, report.summary()
    assert report.registers <= 255 and report.shared_bytes <= H200.shared_memory_per_block


def test_softmax_f32_for_sm_90():
    _check(_ptx(lambda x: F.softmax(x), ("x", "f32", ("n", "m"))), "ld.global.v4.b32")


def test_bf16_layer_norm_for_sm_90():
    report = _ptx(lambda x, w, b: F.layer_norm(x, w, b),
                  ("x", "bf16", ("n", "m")), ("w", "bf16", ("m",)), ("b", "bf16", ("m",)))
    _check(report, "ld.global.v4.b32")  # eight bf16 a load
    assert "cvt.rn.bf16" in report.ptx or "cvt.rn.bf16x2" in report.ptx, report.summary()


def test_a_column_sum_reads_rows_in_vectors():
    _check(_ptx(lambda x: F.sum(x, 0), ("x", "f32", ("n", "m"))), "ld.global.v4.b32")


def test_ptx_is_for_nvidia_targets_only():
    kernel, _ = lower_group(trace(F.exp, ("x", "f32", (4, 4)))["main"])
    with pytest.raises(UnsupportedError, match="NVIDIA"):
        compile_ptx(kernel, choose_gpu_schedule(kernel, H200), gpu_target("mi300x"))


@pytest.mark.parametrize(("codes", "zero_point"), [("i8", False), ("u8", True), ("i4", False)])
def test_dequantizing_gemm_specs_compile_for_sm_90(codes, zero_point):
    """Every code dtype the dequantizing GEMM takes has a pointer type (u8 with zero points
    raised a KeyError); the f32 x codes tile is compiled, not checked for spills (it spills
    today: the IEEE f32 product holds both operand fragments in registers)."""
    from tilefold.codegen.triton.gemm import GemmSpec
    from tilefold.codegen.triton.gemm_config import GemmConfig
    from tilefold.codegen.triton.ptx import compile_gemm_ptx

    report = compile_gemm_ptx(GemmSpec("f32", codes, zero_point=zero_point),
                              GemmConfig(64, 64, 64, 8, 4, 3, 1), H200, ("f32",))
    assert 0 < report["registers"] <= 255 and ".target sm_90" in report["ptx"]
