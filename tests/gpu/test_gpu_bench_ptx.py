"""The configs tilefold's tuner proposes for benchmarks/gpu.py's shapes, compiled for sm_90 on
the CPU: each fits the 232,448 bytes of shared memory a Hopper block may use, and ptxas spills
nothing. CI compiles the first proposal of each kind (and the persistent TMA twin);
TILEFOLD_PTX_ALL=1 compiles every one."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")

from tilefold.codegen.triton.attention import AttentionSpec
from tilefold.codegen.triton.attention_config import propose_attention_configs
from tilefold.codegen.triton.gemm import GemmSpec
from tilefold.codegen.triton.gemm_config import propose_configs
from tilefold.codegen.triton.ptx import compile_attention_ptx, compile_gemm_ptx
from tilefold.target import gpu_target

H200 = gpu_target("h200")
ALL = os.environ.get("TILEFOLD_PTX_ALL", "0") not in ("", "0")
LIMIT = 232_448


def _gemm_cases():
    cases = []
    for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192)):
        for i, c in enumerate(propose_configs(H200, m, n, k, "bf16", tma=True, out_dtype="bf16")):
            for order in ("nk", "kn") if c.persistent else (None,):
                cases.append((f"bf16-{m}-{i}-{order}", GemmSpec("bf16", "bf16", tma=order), c,
                              i < 2 and m == 8192))
        for fast in (False, True):
            for i, c in enumerate(propose_configs(H200, m, n, k, "fp8e4m3", out_dtype="bf16",
                                                  fp8_fast_accum=fast)):
                cases.append((f"fp8-{'fast' if fast else 'precise'}-{m}-{i}",
                              GemmSpec("fp8e4m3", "fp8e4m3", fp8_fast_accum=fast), c,
                              i == 0 and m == 8192))
        for i, c in enumerate(propose_configs(H200, m, n, k, "f32")):  # IEEE FMA products
            cases.append((f"f32-{m}-{i}", GemmSpec("f32", "f32"), c, i == 0 and m == 4096))
    return [pytest.param(spec, c, id=name) for name, spec, c, ci in cases if ALL or ci]


@pytest.mark.parametrize("spec,config", _gemm_cases())
def test_bench_gemm_configs_fit_shared_memory_without_spills(spec, config):
    report = compile_gemm_ptx(spec, config, H200, ("f32" if spec.a == "f32" else "bf16",))
    assert 0 < report["shared"] <= LIMIT, (config, report["shared"])
    assert report["spills"] == 0 and report["registers"] <= 255, (config, report["registers"])
    if spec.a == "fp8e4m3":  # wgmma reads fp8 as it is, from shared memory
        assert "wgmma.mma_async.sync.aligned" in report["ptx"] and ".e4m3.e4m3" in report["ptx"]


def _attention_cases():
    cases = []
    for b, h, s, d in ((4, 32, 2048, 128), (1, 32, 8192, 128)):
        for i, c in enumerate(propose_attention_configs(H200, b * h, s, s, d, "bf16")):
            if ALL or (i == 0 and s == 8192):
                cases.append(pytest.param(c, d, id=f"{s}-{i}"))
    return cases


@pytest.mark.parametrize("config,d", _attention_cases())
def test_bench_attention_configs_fit_shared_memory_without_spills(config, d):
    report = compile_attention_ptx(AttentionSpec("bf16", causal=True), H200, d, config.block_m,
                                   config.block_n, config.num_warps, config.num_stages)
    assert 0 < report["shared"] <= LIMIT and report["spills"] == 0, (config, report["spills"])
