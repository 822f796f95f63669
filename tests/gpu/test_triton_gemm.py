"""The Triton GEMM template run by Triton's interpreter on CPU torch tensors (or compiled on
CUDA ones: `placement.py`) against float64 NumPy (shapes of 1, primes, M == N == K, K tails,
strided and broadcast operands, each epilogue, int8/int4 weights, both split-K variants, fp16
and fp8), its configs, and its sm_90 PTX: wgmma for bf16, fp16 and fp8, shared memory within the
227 KB of a Hopper block, and no TF32 for f32 operands.

Triton's interpreter computes bf16 wrongly, so a bf16 GEMM runs there as an f32 one on f32
copies of its bf16 operands (`codegen/triton/gemm_launch.py`): there the bf16 cases check the
widening and the rounding of C (the PTX test compiles the bf16 dot); on the device, the bf16
dot itself. TILEFOLD_GPU_SWEEP=1 adds a larger sweep of shapes and tiles.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

from tests.gpu.placement import (  # noqa: E402
    DEVICE,
    ON_DEVICE,
    compiled_kernels,
    f64,
    host,
    tensor,
)
from tests.tolerances import assert_close  # noqa: E402
from tilefold.codegen.triton.gemm import GemmSpec  # noqa: E402
from tilefold.codegen.triton.gemm_config import GemmConfig, propose_configs  # noqa: E402
from tilefold.codegen.triton.gemm_group import TritonGemmGroup  # noqa: E402
from tilefold.codegen.triton.gemm_launch import TritonGemm  # noqa: E402
from tilefold.codegen.triton.ptx import compile_gemm_ptx  # noqa: E402
from tilefold.errors import ShapeError, UnsupportedError  # noqa: E402
from tilefold.ir import functional as F  # noqa: E402
from tilefold.ir import trace  # noqa: E402
from tilefold.quant import quantize  # noqa: E402
from tilefold.target import gpu_target  # noqa: E402

H200 = gpu_target("h200")
RNG = np.random.default_rng(1616)
SMALL = GemmConfig(16, 16, 32, 2, 4, 2)  # several tiles, a partial swizzle group, K tails
SWEEP = os.environ.get("TILEFOLD_GPU_SWEEP") == "1"
erf = np.vectorize(math.erf)


def _normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _gelu(x):
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


SHAPES = [(1, 1, 1), (7, 13, 29), (37, 37, 37), (33, 17, 100), (64, 64, 64)]
if SWEEP:
    SHAPES += [(m, n, k) for m in (1, 31, 128) for n in (1, 67, 128) for k in (1, 97, 128)]


@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_f32_gemm_of_odd_shapes(mnk):
    m, n, k = mnk
    a, b = _normal(m, k), _normal(k, n)
    (c,) = TritonGemm("f32", "f32")(tensor(a), tensor(b), config=SMALL)
    assert_close(host(c), a.astype(np.float64) @ b, dtype="f32", reduced=k)


def test_transposed_operands_are_strides():
    at, bt = _normal(45, 19), _normal(23, 45)  # A^T [K, M] and B^T [N, K] in memory
    a, b = tensor(at).t(), tensor(bt).t()
    assert a.stride() == (1, 19) and b.stride() == (1, 45)
    (c,) = TritonGemm("f32", "f32")(a, b, config=SMALL)
    assert_close(host(c), at.T.astype(np.float64) @ bt.T, dtype="f32", reduced=45)


def test_broadcast_batch_reads_b_once_per_batch():
    a, b = _normal(3, 2, 11, 40), _normal(40, 9)  # B broadcast: batch stride 0
    (c,) = TritonGemm("f32", "f32")(tensor(a), tensor(b), config=SMALL)
    assert c.shape == (3, 2, 11, 9)
    assert_close(host(c), a.astype(np.float64) @ b, dtype="f32", reduced=40)
    a1, b3 = _normal(1, 6, 20), _normal(4, 20, 5)  # A broadcast along the batch
    (c,) = TritonGemm("f32", "f32")(tensor(a1), tensor(b3), config=SMALL)
    assert_close(host(c), a1.astype(np.float64) @ b3, dtype="f32", reduced=20)


def test_swizzle_covers_every_tile_once():
    for group_m in (2, 3):  # 5 row blocks: groups of 2 or 3 leave a partial group
        a, b = _normal(80, 33), _normal(33, 40)
        config = GemmConfig(16, 16, 32, group_m, 4, 2)
        (c,) = TritonGemm("f32", "f32")(tensor(a), tensor(b), config=config)
        assert_close(host(c), a.astype(np.float64) @ b, dtype="f32", reduced=33)


@pytest.mark.parametrize("dtype,out", [("f16", "f32"), ("f16", "f16"), ("fp8e4m3", "f32"),
                                       ("fp8e4m3", "bf16")])
def test_low_precision_operands_accumulate_in_f32(dtype, out):
    td = {"f16": torch.float16, "fp8e4m3": torch.float8_e4m3fn}[dtype]
    a, b = tensor(_normal(29, 70)).to(td), tensor(_normal(70, 31)).to(td)
    (c,) = TritonGemm(dtype, dtype, out_dtypes=(out,))(a, b, config=SMALL)
    want = f64(a) @ f64(b)  # the operands' own values: only the f32 sums and C round
    assert_close(f64(c), want, dtype=out, reduced=70)


@pytest.mark.parametrize("split", ["none", "workspace"])
def test_bf16_gemm_with_a_strided_b(split):
    a = tensor(_normal(2, 19, 45)).to(torch.bfloat16)
    b = tensor(_normal(45, 24)).to(torch.bfloat16).t().contiguous().t()  # strided bf16 B
    config = SMALL if split == "none" else GemmConfig(16, 16, 16, 2, 4, 2, 3)
    gemm = TritonGemm("bf16", "bf16", split=split, out_dtypes=("bf16",))
    (c,) = gemm(a, b, config=config)
    assert c.dtype == torch.bfloat16
    assert gemm.spec.a == ("bf16" if ON_DEVICE else "f32")  # widened for the interpreter
    assert_close(f64(c), f64(a) @ f64(b), dtype="bf16", reduced=45)


def _group(fn, *params, split="none"):
    return TritonGemmGroup(trace(fn, *params)["main"], H200, split=split)


def test_bias_on_m_and_on_n_take_their_roles_from_the_ir():
    n = 24  # M == N == K: a bias on M and one on N have the same shape
    x, w, bm, bn = _normal(n, n), _normal(n, n), _normal(n), _normal(n)
    g = _group(lambda x, w, bm, bn: F.matmul(x, w) + F.expand_dims(bm, [1]) + bn,
               ("x", "f32", (n, n)), ("w", "f32", (n, n)), ("bm", "f32", (n,)),
               ("bn", "f32", (n,)))
    (c,) = g(tensor(x), tensor(w), tensor(bm), tensor(bn), config=SMALL)
    want = x.astype(np.float64) @ w + bm[:, None] + bn
    assert_close(host(c), want, dtype="f32", reduced=n)
    src = g.source(tensor(x), tensor(w), tensor(bm), tensor(bn))
    assert "mask=m_mask" in src and "mask=n_mask" in src  # one row value, one shared row
    (proposed,) = g(*map(tensor, (x, w, bm, bn)))  # the config propose_configs picks
    assert_close(host(proposed), want, dtype="f32", reduced=n)


def test_activation_residual_and_scale_fused_before_the_store():
    m, n, k = 21, 35, 50
    x, w, b, r = _normal(m, k), _normal(k, n), _normal(n), _normal(m, n)
    def fn(x, w, b, r):
        t = F.matmul(x, w) + b
        return F.gelu(t) * 0.25 + r, F.silu(t)

    g = _group(fn, ("x", "f32", (m, k)), ("w", "f32", (k, n)), ("b", "f32", (n,)),
               ("r", "f32", (m, n)))
    got = g(tensor(x), tensor(w), tensor(b), tensor(r), config=SMALL)
    t = x.astype(np.float64) @ w + b
    want = [_gelu(t) * 0.25 + r, t / (1 + np.exp(-t))]
    for c, expect in zip(got, want, strict=True):
        assert_close(host(c), expect, dtype="f32", reduced=k, scale=np.abs(t) + 1)


def test_batched_epilogue_operands_index_their_own_dims():
    bsz, m, n, k = 3, 13, 18, 21  # a residual shared by the batch, a bias per batch entry
    x, w, r, b = _normal(bsz, m, k), _normal(k, n), _normal(m, n), _normal(bsz, 1, n)
    g = _group(lambda x, w, r, b: F.matmul(x, w) * 2.0 + r + b,
               ("x", "f32", (bsz, m, k)), ("w", "f32", (k, n)), ("r", "f32", (m, n)),
               ("b", "f32", (bsz, 1, n)))
    (c,) = g(tensor(x), tensor(w), tensor(r), tensor(b), config=SMALL)
    want = (x.astype(np.float64) @ w) * 2 + r + b
    assert_close(host(c), want, dtype="f32", reduced=k, scale=2.0)


def test_bf16_group_rounds_c_before_its_epilogue():
    m, n, k = 17, 40, 33
    xs, ws, bs = (tensor(_normal(*s)).to(torch.bfloat16) for s in ((m, k), (k, n), (n,)))
    g = _group(lambda x, w, b: F.relu(F.matmul(x, w) + b), ("x", "bf16", (m, k)),
               ("w", "bf16", (k, n)), ("b", "bf16", (n,)))
    (c,) = g(xs, ws, bs, config=SMALL)
    c64 = torch.from_numpy(f64(xs) @ f64(ws)).to(torch.bfloat16).double().numpy()
    want = np.maximum(c64 + f64(bs), 0)  # C rounded to bf16, then the sum rounded once
    assert c.dtype == torch.bfloat16
    assert_close(f64(c), want, dtype="bf16", scale=np.abs(c64) + 1)


def test_split_k_workspace_keeps_the_epilogue():
    m, n, k = 3, 20, 257  # small M, long K, a K tail in the last split
    x, w, b = _normal(m, k), _normal(k, n), _normal(n)
    g = _group(lambda x, w, b: F.gelu(F.matmul(x, w) + b), ("x", "f32", (m, k)),
               ("w", "f32", (k, n)), ("b", "f32", (n,)), split="workspace")
    (c,) = g(tensor(x), tensor(w), tensor(b), config=GemmConfig(16, 16, 32, 8, 4, 2, 4))
    t = x.astype(np.float64) @ w + b
    assert_close(host(c), _gelu(t), dtype="f32", reduced=k, scale=np.abs(t) + 1)


@pytest.mark.parametrize("split_k", [2, 5])
def test_split_k_atomic_adds_partials(split_k):
    a, b = _normal(2, 3, 200), _normal(200, 30)
    gemm = TritonGemm("f32", "f32", split="atomic")
    (c,) = gemm(tensor(a), tensor(b), config=GemmConfig(16, 16, 32, 8, 4, 2, split_k))
    assert_close(host(c), a.astype(np.float64) @ b, dtype="f32", reduced=200)


def _dequantized(qt) -> np.ndarray:
    """(codes - zero point) * scale in float64, each block's values repeated over it."""
    group = qt.shape[0] // qt.scale.shape[0]
    codes = qt.codes().astype(np.float64)
    if qt.zero_point is not None:
        codes = codes - np.repeat(qt.zero_point.astype(np.float64), group, axis=0)
    return codes * np.repeat(qt.scale.astype(np.float64), group, axis=0)


@pytest.mark.parametrize("fmt,group", [("int8", None), ("int4", 32), ("int4", 16)])
def test_dequantized_weights(fmt, group):
    k, n = 96, 27
    w = _normal(k, n)
    qt = quantize(w, fmt, group_size=group)
    x = _normal(2, 9, k)
    (c,) = TritonGemm("f32", "i8" if fmt == "int8" else "i4")(
        tensor(x), tensor(qt.data), scale=tensor(qt.scale), config=SMALL)
    assert_close(host(c), x.astype(np.float64) @ _dequantized(qt), dtype="f32", reduced=k)


@pytest.mark.parametrize("fmt,group", [("int8", None), ("int4", 32)])
def test_asymmetric_weights_subtract_their_zero_points(fmt, group):
    k, n = 64, 21
    qt = quantize(_normal(k, n) + 0.7, fmt, group_size=group, symmetric=False)
    x = _normal(5, k)
    zero = tensor(qt.zero_point.astype(np.int16)).to(  # int4's i4 as bytes
        torch.uint8 if fmt == "int8" else torch.int8)
    gemm = TritonGemm("f32", "u8" if fmt == "int8" else "i4", zero_point=True)
    (c,) = gemm(tensor(x), tensor(qt.data), scale=tensor(qt.scale), zero_point=zero, config=SMALL)
    assert_close(host(c), x.astype(np.float64) @ _dequantized(qt), dtype="f32", reduced=k)


def test_fp8_weights_with_scales_under_an_f16_activation():
    k, n = 48, 17
    qt = quantize(_normal(k, n), "fp8")  # one scale a column
    codes = tensor(qt.data.view(np.uint8)).view(torch.float8_e4m3fn)
    x = tensor(_normal(2, 7, k)).to(torch.float16)
    (c,) = TritonGemm("f16", "fp8e4m3", out_dtypes=("f16",))(
        x, codes, scale=tensor(qt.scale), config=SMALL)
    # each weight rounded to the activation's f16 before the dot, as the template documents
    deq = _dequantized(qt).astype(np.float16).astype(np.float64)
    assert_close(f64(c), f64(x) @ deq, dtype="f16", reduced=k)


def test_int4_weights_dequantize_to_an_f16_activation():
    k, n = 64, 19
    qt = quantize(_normal(k, n), "int4", group_size=32)
    x = tensor(_normal(11, k)).to(torch.float16)
    (c,) = TritonGemm("f16", "i4")(x, tensor(qt.data), scale=tensor(qt.scale), config=SMALL)
    deq16 = _dequantized(qt).astype(np.float16).astype(np.float64)  # in A's dtype, as documented
    assert_close(host(c), f64(x) @ deq16, dtype="f32", reduced=k)


def test_bad_input_is_a_clear_error():
    with pytest.raises(UnsupportedError, match="atomic split-K"):
        TritonGemm("f32", "f32", split="atomic", out_dtypes=("bf16",))
    with pytest.raises(ShapeError, match="K = 7"):
        TritonGemm("f32", "f32")(tensor(_normal(3, 7)), tensor(_normal(8, 2)))
    with pytest.raises(ShapeError, match="scales"):
        TritonGemm("f32", "i8")(tensor(_normal(3, 8)), torch.zeros(8, 2, dtype=torch.int8,
                                                                        device=DEVICE))
    with pytest.raises(UnsupportedError, match="one dtype"):
        GemmSpec("f16", "f32")
    g = _group(lambda x, w: F.softmax(F.matmul(x, w)), ("x", "f32", (4, 8)),
               ("w", "f32", (8, 6)))
    with pytest.raises(UnsupportedError, match="reduces along C's rows"):
        g(tensor(_normal(4, 8)), tensor(_normal(8, 6)))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "fp8e4m3"])
def test_configs_fit_shared_memory_and_split_small_m(dtype):
    for m, n, k in ((4096, 4096, 4096), (1, 4096, 4096), (16, 128, 8192), (5, 7, 3)):
        configs = propose_configs(H200, m, n, k, dtype)
        assert configs
        for c in configs:
            assert c.shared_bytes(dtype) <= H200.shared_memory_per_block == 227 * 1024
    assert propose_configs(H200, 16, 128, 8192, dtype)[0].split_k > 1  # 1 tile, 132 SMs
    assert propose_configs(H200, 4096, 4096, 4096, dtype)[0].split_k == 1
    assert propose_configs(gpu_target("sm_90"), 16, 128, 8192, dtype)[0].split_k == 1


def test_configs_refuse_a_dtype_the_matrix_units_lack():
    with pytest.raises(UnsupportedError, match=r"a100's matrix units take .*not fp8e4m3"):
        propose_configs(gpu_target("a100"), 64, 64, 64, "fp8e4m3")
    assert propose_configs(gpu_target("a100"), 64, 64, 64, "bf16")


@pytest.mark.parametrize("dtype,out", [("bf16", "bf16"), ("f16", "f16"), ("fp8e4m3", "bf16")])
def test_sm_90_ptx_uses_wgmma_within_shared_memory(dtype, out):
    config = propose_configs(H200, 4096, 4096, 4096, dtype)[0]
    report = compile_gemm_ptx(GemmSpec(dtype, dtype), config, H200, (out,))
    assert ".target sm_90" in report["ptx"]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\.f32", report["ptx"])
    assert 0 < report["shared"] <= H200.shared_memory_per_block
    assert report["spills"] == 0


def test_a_fused_compute_group_runs_through_the_backend():
    from tilefold.cli.emit import fused_groups
    from tilefold.codegen.backend import get_backend

    path = str(Path(__file__).resolve().parents[2] / "examples" / "linear_gelu.tfir")
    ((kind, names, region),) = fused_groups(path, "main")
    assert (kind, names) == ("compute", ["matmul", "add", "gelu"])
    x, w, b = (tensor(_normal(*s)).to(torch.bfloat16) for s in ((9, 256), (256, 512), (512,)))
    (c,) = get_backend("triton").gemm(region, H200)(x, w, b, config=GemmConfig(16, 128, 128))
    c64 = torch.from_numpy(f64(x) @ f64(w)).to(torch.bfloat16).double().numpy()
    t = torch.from_numpy(c64 + f64(b)).to(torch.bfloat16).double().numpy()
    assert_close(f64(c), _gelu(t), dtype="bf16", scale=np.abs(t) + 1)


def test_view_prologues_become_strides():
    def fn(xt, w):  # A given as [batch, K, M], B broadcast to the batch
        return F.matmul(F.transpose(xt, (0, 2, 1)), F.broadcast_to(F.expand_dims(w, 0),
                                                                   (3, 30, 14)))

    g = _group(fn, ("xt", "f32", (3, 30, 11)), ("w", "f32", (30, 14)))
    xt, w = _normal(3, 30, 11), _normal(30, 14)
    (c,) = g(tensor(xt), tensor(w), config=SMALL)
    want = np.swapaxes(xt, 1, 2).astype(np.float64) @ w
    assert_close(host(c), want, dtype="f32", reduced=30)


DEQUANT = """module {
  func @main(%x: f32[2,9,40], %q: i8[24,40], %s: f32[24,1], %b: f32[24]) -> (f32[2,9,24]) {
    %0 = dequantize(%q, %s) {dtype = f32} : f32[24,40]
    %1 = transpose(%0) {perm = [1, 0]} : f32[40,24]
    %2 = matmul(%x, %1) : f32[2,9,24]
    %3 = add(%2, %b) : f32[2,9,24]
    return(%3)
  }
}
"""


def test_dequantize_prologue_of_a_torch_layout_weight():
    from tilefold.ir import parse_module

    w = _normal(24, 40)  # [N, K] as torch stores a linear weight, one scale per output row
    qt = quantize(w, "int8", axis=1)
    x, b = _normal(2, 9, 40), _normal(24)
    g = TritonGemmGroup(parse_module(DEQUANT).functions["main"], H200)
    (c,) = g(tensor(x), tensor(qt.data), tensor(qt.scale), tensor(b), config=SMALL)
    deq = qt.data.astype(np.float64) * qt.scale
    assert_close(host(c), x.astype(np.float64) @ deq.T + b, dtype="f32", reduced=40)
    assert g.plan(tensor(x), tensor(qt.data), tensor(qt.scale), tensor(b)).dequantize is not None


def test_prologues_the_template_lacks_are_named():
    g = _group(lambda x, w: F.matmul(F.cast(x, "f32"), w), ("x", "f16", (4, 8)),
               ("w", "f32", (8, 6)))
    with pytest.raises(UnsupportedError, match=r"prologue 'cast'.*cast outside the group"):
        g(tensor(_normal(4, 8)).half(), tensor(_normal(8, 6)))

    def reuse(x, w):
        wt = F.transpose(w, (1, 0))
        return F.matmul(x, wt) + wt

    g = _group(reuse, ("x", "f32", (4, 4)), ("w", "f32", (4, 4)))
    with pytest.raises(UnsupportedError, match=r"the epilogue reads .*, a prologue value"):
        g(tensor(_normal(4, 4)), tensor(_normal(4, 4)))


def test_sm_90_ptx_of_an_f32_gemm_multiplies_in_ieee_f32():
    report = compile_gemm_ptx(GemmSpec("f32", "f32"), GemmConfig(64, 64, 32, 8, 4, 3), H200)
    ptx = report["ptx"]
    assert "fma.rn.f32" in ptx and "tf32" not in ptx  # no TF32 tensor-core dot
    assert not re.search(r"\bw?gmma\.|\bmma\.sync", ptx)
    assert report["spills"] == 0


@pytest.mark.device_only("checks the binary Triton compiled for the CUDA device")
def test_a_bf16_gemm_ran_pipelined_on_the_matrix_units():
    gemm = TritonGemm("bf16", "bf16", out_dtypes=("bf16",))
    assert gemm.spec.a == "bf16" and "for i in range(0, K_ITERS):" in gemm.source
    a, b = (tensor(_normal(*s)).to(torch.bfloat16) for s in ((200, 300), (300, 136)))
    (c,) = gemm(a, b, config=GemmConfig(64, 64, 64, 8, 4, 3))  # K tail, partial tiles
    assert_close(f64(c), f64(a) @ f64(b), dtype="bf16", reduced=300)
    binaries = compiled_kernels(gemm.fn)
    assert binaries and all(k.metadata.num_stages == 3 for k in binaries)
    hopper = torch.cuda.get_device_capability()[0] == 9
    form = r"wgmma\.mma_async\S*\.bf16\.bf16" if hopper else r"mma\.sync\S*\.bf16\.bf16"
    assert re.search(form, binaries[0].asm["ptx"])


@pytest.mark.parametrize("a,b,split", [("f16", "i4", "none"), ("bf16", "i8", "workspace")])
def test_sm_90_ptx_of_dequantizing_and_split_k_gemms(a, b, split):
    config = GemmConfig(128, 128, 64, 8, 8, 3, 1 if split == "none" else 4)
    report = compile_gemm_ptx(GemmSpec(a, b, split=split), config, H200)
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.{a}\.{a}",
                     report["ptx"])
    assert report["shared"] <= H200.shared_memory_per_block and report["spills"] == 0


ASYMMETRIC = """module {
  func @main(%x: f32[5,40], %q: u8[40,24], %s: f32[1,24], %z: u8[1,24]) -> (f32[5,24]) {
    %0 = dequantize(%q, %s, %z) {dtype = f32} : f32[40,24]
    %1 = matmul(%x, %0) : f32[5,24]
    %2 = relu(%1) : f32[5,24]
    return(%2)
  }
}
"""


def test_asymmetric_dequantize_prologue_from_the_ir():
    from tilefold.ir import parse_module

    qt = quantize(_normal(40, 24) + 0.5, "int8", symmetric=False)
    x = _normal(5, 40)
    g = TritonGemmGroup(parse_module(ASYMMETRIC).functions["main"], H200)
    (c,) = g(tensor(x), tensor(qt.data), tensor(qt.scale), tensor(qt.zero_point), config=SMALL)
    t = x.astype(np.float64) @ _dequantized(qt)
    assert_close(host(c), np.maximum(t, 0), dtype="f32", reduced=40)
