"""Other ISAs: the AVX2 path runs here; NEON and AVX2 micro-kernels are checked as assembly
(vector FMAs, no stack traffic in the inner loop); NEON also runs under qemu when installed."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.llvm.gemm.module import CODEGEN_OPTIONS, gemm_ir, gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.registry import MICROKERNELS, select_microkernel
from tilefold.runtime import emit_assembly
from tilefold.target import host_target, named_target, target_names


def test_every_target_selects_a_kernel_and_every_chain_ends_at_generic():
    for name in target_names():
        target = named_target(name)
        assert target.family[-1] == "generic", name
        assert select_microkernel(target).dtype == "f32"
    assert select_microkernel(named_target("generic")).name == "generic_4x8"
    assert select_microkernel(named_target("neoverse-v1")).name == "neon_8x12"
    assert select_microkernel(named_target("x86-64-v3")).name == "avx2_6x16"
    assert select_microkernel(named_target("x86-64-v4")).name == "avx512_8x48"


def test_registry_entries_fit_their_register_files():
    """accumulators + B vectors + one broadcast must fit, or the inner loop spills."""
    registers = {"x86-64-v4": 32, "x86-64-v3": 16, "armv8-a": 32, "generic": 16}
    for entry in MICROKERNELS:
        a_regs = 1 if entry.a_lanes == 1 else -(-entry.mr // entry.a_lanes)
        assert entry.mr * entry.nv + entry.nv + a_regs <= registers[entry.family], entry.name


@pytest.mark.parametrize("isa", ["x86-64-v3", "generic"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 23, 19), (61, 130, 77), (6, 16, 300)])
def test_narrower_isas_run_correctly_here(isa, m, n, k):
    module = gemm_module(host_target(isa=isa))
    rng = np.random.default_rng(m * n * k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32).T
    c = np.full((m, n), np.nan, np.float32)
    make_plan(module, a, b, c, 0, 2)(a, b, c)
    check_matmul(c, a, b)


def _inner_loop(asm: str, kernel_symbol: str, fma: str) -> str:
    """The basic block of `kernel_symbol` holding the most FMAs: the k loop."""
    body = asm[asm.index(f"{kernel_symbol}:"):]
    body = body[:body.index(".Lfunc_end")]
    blocks = re.split(r"\n\.?L\w+:", body)
    return max(blocks, key=lambda blk: blk.count(fma))


@pytest.mark.parametrize("target_name, fma, spill", [
    ("neoverse-v1", "fmla", r"\[sp"),
    # Frame-pointer spills sit below %rbp; %rbp itself may hold a pointer (the prefetch stream).
    ("x86-64-v3", "vfmadd", r"\(%rsp\)|-\d+\(%rbp\)"),
])
def test_microkernel_assembly(target_name, fma, spill):
    target = named_target(target_name)
    kernel = select_microkernel(target)
    asm = emit_assembly(gemm_ir(target, kernel), target, **CODEGEN_OPTIONS)
    loop = _inner_loop(asm, kernel.spec(kernel.mr, kernel.nv).name, fma)
    fmas = re.findall(rf"\b{fma}\w*\s+([^\n]*)", loop)
    assert len(fmas) >= kernel.mr * kernel.nv, loop
    if fma == "vfmadd":
        assert all("ymm" in ops for ops in fmas), "AVX2 FMAs must be on ymm registers"
    else:
        assert all(".4s" in ops for ops in fmas), "NEON FMAs must be on 4 x f32 vectors"
    assert not re.search(spill, loop), f"stack traffic in the inner loop:\n{loop}"
