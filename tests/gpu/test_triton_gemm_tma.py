"""The GEMM template's persistent TMA variant (sm_90): run by Triton's interpreter, which
supports tensor descriptors, on CPU torch tensors (or compiled on a Hopper GPU's CUDA tensors:
`placement.py`) against float64 NumPy (odd M, N and K, B row-major and stored transposed, a
broadcast batch, fused epilogues, several tiles a program), the operands it refuses, the
configs that propose it, the tuner racing it, and its sm_90 PTX for bf16 and fp8 (f16 takes
bf16's path): TMA copies (`cp.async.bulk.tensor`) feeding wgmma within the 227 KB of a Hopper
block.

As in test_triton_gemm.py, a bf16 GEMM runs under the interpreter as an f32 one on f32 copies
of its bf16 operands, so there the bf16 cases check the widening and C's rounding around the
variant (the PTX test compiles Triton's bf16 dot); on the device, the bf16 dot itself.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

from tests.gpu.placement import DEVICE, f64, host, tensor  # noqa: E402
from tests.tolerances import assert_close  # noqa: E402
from tilefold.codegen.triton.gemm import GemmSpec, emit_gemm  # noqa: E402
from tilefold.codegen.triton.gemm_config import GemmConfig, propose_configs  # noqa: E402
from tilefold.codegen.triton.gemm_group import TritonGemmGroup  # noqa: E402
from tilefold.codegen.triton.gemm_launch import TritonGemm, tma_order  # noqa: E402
from tilefold.codegen.triton.ptx import compile_gemm_ptx  # noqa: E402
from tilefold.errors import UnsupportedError  # noqa: E402
from tilefold.ir import functional as F  # noqa: E402
from tilefold.ir import trace  # noqa: E402
from tilefold.target import gpu_target  # noqa: E402

H200 = gpu_target("h200")
RNG = np.random.default_rng(1690)
TMA = GemmConfig(16, 32, 32, 2, 4, 2, persistent=3)  # 3 programs, several tiles each
TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
         "fp8e4m3": torch.float8_e4m3fn}
erf = np.vectorize(math.erf)


def _padded(dtype: str, *shape: int):
    """A random tensor of `shape` whose rows are a view into rows padded to 16 elements, so
    odd sizes keep 16-byte aligned strides, as TMA needs."""
    width = -(-shape[-1] // 16) * 16
    full = RNG.standard_normal((*shape[:-1], width)).astype(np.float32)
    return tensor(full).to(TORCH[dtype])[..., :shape[-1]]


def _rounded(x, dtype: str):
    """float64 `x` rounded to `dtype` (the graph IR rounds each op's result)."""
    return torch.from_numpy(x).to(TORCH[dtype]).double().numpy() if dtype != "f32" else x


def _gelu(x):
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("order", ["kn", "nk"])
def test_persistent_gemm_with_a_bias_and_gelu_epilogue(dtype, order):
    bsz, m, n, k = 2, 37, 45, 70  # 3 x 2 tiles an entry, 12 tiles over 3 programs
    x = _padded(dtype, bsz, m, k)
    w = _padded(dtype, k, n) if order == "kn" else _padded(dtype, n, k)  # [N, K]: a linear's
    b = _padded(dtype, n)

    def fn(x, w, b):
        return F.gelu(F.matmul(x, w if order == "kn" else F.transpose(w, (1, 0))) + b)

    g = TritonGemmGroup(trace(fn, ("x", dtype, (bsz, m, k)), ("w", dtype, tuple(w.shape)),
                              ("b", dtype, (n,)))["main"], H200)
    assert g.tma(x, w, b)
    (c,) = g(x, w, b, config=TMA)
    w64 = f64(w) if order == "kn" else f64(w).T
    t = _rounded(_rounded(f64(x) @ w64, dtype) + f64(b), dtype)  # B broadcast over the batch
    assert c.dtype == TORCH[dtype]
    assert_close(f64(c), _gelu(t), dtype=dtype, reduced=k, scale=np.abs(t) + 1)


@pytest.mark.parametrize("out", ["f32", "bf16"])
def test_persistent_fp8_gemm_reads_fp8_through_descriptors(out):
    a = _padded("fp8e4m3", 29, 48)
    bt = _padded("fp8e4m3", 37, 48)  # B stored [N, K]
    gemm = TritonGemm("fp8e4m3", "fp8e4m3", out_dtypes=(out,))
    assert gemm.tma_order(a, bt.t()) == "nk"
    (c,) = gemm(a, bt.t(), config=TMA)
    assert_close(f64(c), f64(a) @ f64(bt).T, dtype=out, reduced=48)


def test_broadcast_and_single_entry_dims_take_any_stride():
    a = _padded("f16", 1, 21, 40).expand(3, 21, 40)  # one A for every batch entry: stride 0
    b = _padded("f16", 3, 40, 50)
    assert a.stride(0) == 0
    (c,) = TritonGemm("f16", "f16")(a, b, config=TMA)
    assert_close(host(c), f64(a) @ f64(b), dtype="f32", reduced=40)
    row = tensor(RNG.standard_normal((1, 37)).astype(np.float32)).half()
    w = _padded("f16", 37, 24)  # one row of A: its 74-byte stride is never used
    (c,) = TritonGemm("f16", "f16")(row, w, config=TMA)
    assert_close(host(c), f64(row) @ f64(w), dtype="f32", reduced=37)


def test_the_variant_source_copies_tiles_through_descriptors():
    compiled = emit_gemm(GemmSpec("bf16", "bf16", tma="nk"))
    assert "tl.make_tensor_descriptor(a_ptr, [A_BATCH, M, K]" in compiled
    assert "tl.make_tensor_descriptor(b_ptr, [B_BATCH, N, K]" in compiled
    assert "tl.range(tl.program_id(0), tiles * BATCH, PROGRAMS, flatten=True)" in compiled
    assert ".reshape(BLOCK_N, BLOCK_K).T" in compiled and "a_ptrs" not in compiled
    interpreted = emit_gemm(GemmSpec("f32", "f32", tma="kn", pipelined=False))
    assert "while tile < tiles * BATCH:" in interpreted and "tl.range" not in interpreted


def test_operands_tma_cannot_copy_are_refused_by_name():
    gemm = TritonGemm("f16", "f16")
    a, b = _padded("f16", 9, 37), _padded("f16", 37, 24)  # 37 f16 are 74 bytes a row of A
    a = a.contiguous()
    assert gemm.tma_order(a, b) is None
    with pytest.raises(UnsupportedError, match=r"A \[1, 9, 37\]'s stride 37 .* 74 bytes.*"
                                               r"persistent=0"):
        gemm(a, b, config=TMA)
    order, why = tma_order(_padded("f16", 1, 32, 9).transpose(1, 2), b[None, :32], "f16")
    assert order is None and "rows do not run along K" in why
    for narrow in (b.contiguous()[:, :21].contiguous(), b.t().contiguous()[:21].t()):
        order, why = tma_order(_padded("f16", 1, 9, 37), narrow[None], "f16")  # 42 or 74 bytes
        assert order is None and re.search(r"B \[1, 37, 21\]'s stride (21|37) along", why)
    order, why = tma_order(_padded("f16", 1, 9, 37), _padded("f16", 1, 37, 48)[..., ::2],
                           "f16")
    assert order is None and "contiguous along neither N nor K (strides [1776, 48, 2])" in why
    with pytest.raises(UnsupportedError, match="persistent TMA variant copies A and B"):
        GemmSpec("f32", "i8", tma="kn")
    with pytest.raises(UnsupportedError, match="no K split"):
        GemmConfig(persistent=132, split_k=2)
    assert TritonGemm("f32", "i8").tma_order(a.float(), b.to(torch.int8)) is None


def test_only_sm_90_chips_propose_the_persistent_twin_when_operands_suit():
    for dtype, out in (("bf16", "f32"), ("bf16", "bf16"), ("f16", "f16"), ("fp8e4m3", "bf16")):
        first, twin, *rest = propose_configs(H200, 4096, 4096, 4096, dtype, tma=True,
                                             out_dtype=out)
        assert (twin.persistent, first.persistent) == (H200.sm_count, 0)
        assert (twin.block_m, twin.block_n, twin.block_k) == \
            (first.block_m, first.block_n, first.block_k)
        # the epilogue's scratch holds C's tile in its own dtype beside the pipeline
        scratch = twin.block_m * twin.block_n * (4 if out == "f32" else 2)
        assert twin.shared_bytes(dtype) + scratch < H200.shared_memory_per_block
        assert len(rest) == 3 and not any(c.persistent for c in rest)
    untwinned = [propose_configs(H200, 4096, 4096, 4096, "bf16"),
                 propose_configs(gpu_target("a100"), 4096, 4096, 4096, "bf16", tma=True),
                 propose_configs(gpu_target("sm_90"), 4096, 4096, 4096, "bf16", tma=True),
                 propose_configs(H200, 4096, 4096, 4096, "f32", tma=True),
                 propose_configs(H200, 16, 128, 8192, "bf16", tma=True)]  # split-K first
    assert not any(c.persistent for configs in untwinned for c in configs)


def test_the_tuner_races_the_twin_only_for_operands_that_suit():
    x, w, b = _padded("f16", 33, 40), _padded("f16", 40, 48), _padded("f16", 48)
    g = TritonGemmGroup(trace(lambda x, w, b: F.relu(F.matmul(x, w) + b),
                              ("x", "f16", (33, 40)), ("w", "f16", (40, 48)),
                              ("b", "f16", (48,)))["main"], H200)
    # the same values 2 bytes off a 16-byte boundary
    shifted = torch.empty(40 * 48 + 1, dtype=torch.float16, device=DEVICE)[1:].view(40, 48)
    shifted.copy_(w)
    assert g.tma(x, w, b) and not g.tma(x, shifted, b)
    from tilefold.compiler import optimized
    from tilefold.strategy import METHODS, Problem, context

    module = trace(lambda x, w, b: F.relu(F.matmul(x, w) + b), ("x", "f16", (33, 40)),
                   ("w", "f16", (40, 48)), ("b", "f16", (48,)))
    fused = next(op for op in optimized(module, "main")[0]["main"].ops if op.name == "fused")
    problem = Problem.of(fused, [tuple(t.shape) for t in (x, w, b)])
    proposed = METHODS["triton.gemm"].propose(problem, replace(context(H200), arrays=(x, w, b)))
    assert [c.config["persistent"] for c in proposed] == [0, H200.sm_count, 0, 0, 0]
    twin = propose_configs(H200, 33, 48, 40, "f16", tma=True)[1]
    t = _rounded(_rounded(f64(x) @ f64(w), "f16") + f64(b), "f16")
    # the twin as tuned, then on a B with the same strides whose data TMA cannot copy (a graph
    # keys its tuned choice by shapes and strides): there the same tiles load by pointers
    for weight in (w, shifted):
        (c,) = g(x, weight, b, config=twin)
        assert_close(f64(c), np.maximum(t, 0), dtype="f16", reduced=40, scale=np.abs(t) + 1)


def test_a_compiled_graph_keeps_the_twin_when_it_measures_fastest(tmp_path):
    from tilefold.compiler import optimized
    from tilefold.gpu import GPUGraph
    from tilefold.ir import Builder
    from tilefold.strategy.tuning_db import TuningDB

    m, n, k = 40, 48, 64
    bld = Builder("main")
    xa, wa, ba = (bld.arg(name, "f16", shape) for name, shape in
                  (("x", (m, k)), ("w", (k, n)), ("b", (n,))))
    module = bld.build(F.relu(F.matmul(xa, wa) + ba))
    configs = propose_configs(H200, m, n, k, "f16", tma=True)
    times = iter([5.0, 3.0, 1.0, *[4.0] * (len(configs) - 2)])  # the extern, then the configs
    graph = GPUGraph(optimized(module, "main")[0], "main", H200, strict=True,
                     timer=lambda fn: next(times), budget=30.0, db=TuningDB(tmp_path / "db.json"))
    x, w, b = _padded("f16", m, k), _padded("f16", k, n), _padded("f16", n)
    (c,) = graph(x, w, b)
    t = _rounded(_rounded(f64(x) @ f64(w), "f16") + f64(b), "f16")
    assert_close(f64(c), np.maximum(t, 0), dtype="f16", reduced=k, scale=np.abs(t) + 1)
    (entry,) = TuningDB(tmp_path / "db.json").entries().values()
    assert f'"persistent":{H200.sm_count}' in entry["winner"]
    assert "extern.torch.gpu{}" in entry["timings"]


@pytest.mark.parametrize("dtype,order", [("bf16", "kn"), ("fp8e4m3", "nk")])
def test_sm_90_ptx_copies_tiles_by_tma_into_wgmma(dtype, order):
    # bf16: the twin the cost model proposes for a large GEMM (128 x 256 tiles in 4 stages,
    # the closest to 227 KB); fp8: a small tile with a fused bias and GELU inside the tile loop
    # (GELU's temporaries beside a 128 x 256 f32 accumulator spill, in either variant)
    config = propose_configs(H200, 4096, 4096, 4096, dtype, tma=True)[1]
    spec = GemmSpec(dtype, dtype, tma=order)
    inputs: tuple[str, ...] = ()
    if dtype == "fp8e4m3":
        config = GemmConfig(64, 64, 64, 8, 4, 3, persistent=H200.sm_count)
        shapes = ((256, 64), (512, 64), (512,))  # the epilogue's row program, from a graph
        g = TritonGemmGroup(trace(lambda x, w, b: F.gelu(F.matmul(x, F.transpose(w, (1, 0)))
                                                         + b),
                                  *((name, "bf16", shape) for name, shape in
                                    zip("xwb", shapes, strict=True)))["main"], H200)
        plan = g.plan(*(torch.empty(shape, dtype=torch.bfloat16) for shape in shapes))
        spec = GemmSpec(dtype, dtype, plan.program, plan.stores, plan.c_round, tma=order)
        inputs = ("bf16",)
    report = compile_gemm_ptx(spec, config, H200, ("bf16",), inputs)
    ptx = report["ptx"]
    assert ".target sm_90" in ptx and "cp.async.bulk.tensor.3d.shared" in ptx
    assert "tensormap" in ptx  # the descriptors built in the kernel
    kind = {"bf16": "bf16", "fp8e4m3": "e4m3"}[dtype]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\.f32\.{kind}\.{kind}", ptx)
    assert 0 < report["shared"] <= H200.shared_memory_per_block
    assert report["spills"] == 0
