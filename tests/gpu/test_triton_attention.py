"""The Triton attention template run by Triton's interpreter on CPU torch tensors (or compiled
on CUDA ones: `placement.py`) against float64 NumPy (causal and key-padding masks, grouped-query
heads, several key blocks, a head dim below its tile, f32, f16 and bf16), and compiled for
sm_90: wgmma for both products.

Triton's interpreter computes bf16 wrongly, so bf16 runs there as f32 on f32 copies of the
bf16 operands (there the bf16 case checks the widening; the PTX test compiles the bf16 kernel;
on the device it runs, P rounded to bf16 for the second product). The interpreter runs
`tl.reduce` one element at a time, so the shapes stay small.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

from tests.gpu.placement import ON_DEVICE, compiled_kernels, f64, host, tensor  # noqa: E402
from tests.tolerances import assert_close  # noqa: E402
from tilefold.codegen.triton.attention import AttentionSpec, TritonAttention  # noqa: E402
from tilefold.codegen.triton.ptx import compile_attention_ptx  # noqa: E402
from tilefold.errors import ShapeError, UnsupportedError  # noqa: E402
from tilefold.target import gpu_target  # noqa: E402

H200 = gpu_target("h200")
RNG = np.random.default_rng(1617)
TD = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _reference(q, k, v, causal, lens):
    """softmax(q k^T / sqrt(D) + mask) v in float64, each query head on its key head."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    sq, sk = s.shape[-2:]
    mask = np.ones((q.shape[0], 1, sq, sk), bool)
    if causal:
        mask &= np.tril(np.ones((sq, sk), bool))
    if lens is not None:
        mask &= (np.arange(sk)[None, :] < np.asarray(lens)[:, None])[:, None, None, :]
    s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(top), top, 0))  # a row without keys: all zeros
    total = p.sum(-1, keepdims=True)
    return np.where(total > 0, p / np.where(total > 0, total, 1), 0) @ v


def _run(dtype, causal, lens, shape=(2, 4, 2, 11, 29, 24)):
    b, hq, hkv, sq, sk, d = shape
    q, k, v = (tensor(RNG.standard_normal(s).astype(np.float32)).to(TD[dtype])
               for s in ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d)))
    att = TritonAttention(dtype, causal=causal, padded=lens is not None)
    kv = None if lens is None else tensor(np.array(lens, np.int32))
    out = att(q, k, v, kv_lens=kv, block_m=16, block_n=16)  # two key blocks, a D tail
    want = _reference(*map(f64, (q, k, v)), causal, lens)
    return out, want, att


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lens", [None, [29, 12]], ids=["dense", "padded"])
def test_f32_attention_with_masks_and_grouped_heads(causal, lens):
    out, want, _ = _run("f32", causal, lens)
    assert_close(host(out), want, dtype="f32", reduced=29)


def test_f16_attention():
    out, want, _ = _run("f16", True, None)
    assert out.dtype == torch.float16
    assert_close(f64(out), want, dtype="f16", reduced=29)


def test_bf16_attention():
    out, want, att = _run("bf16", False, [5, 29], shape=(2, 2, 1, 7, 29, 16))
    assert out.dtype == torch.bfloat16
    assert att.spec.dtype == ("bf16" if ON_DEVICE else "f32")  # widened for the interpreter
    # on the device P is rounded to bf16 for P V: at most 2**-9 max|v| off, inside the bf16
    # rule's 2 u(bf16) = 2**-7 for values of unit size
    assert_close(f64(out), want, dtype="bf16", reduced=29)


@pytest.mark.device_only("checks the binary Triton compiled for the CUDA device")
def test_bf16_attention_ran_pipelined_on_the_matrix_units():
    q, k, v = (tensor(RNG.standard_normal(s).astype(np.float32)).to(torch.bfloat16)
               for s in ((2, 4, 100, 64), (2, 2, 100, 64), (2, 2, 100, 64)))
    att = TritonAttention("bf16", causal=True, padded=True)
    lens = [100, 37]
    out = att(q, k, v, kv_lens=tensor(np.array(lens, np.int32)), block_m=64, block_n=64)
    assert_close(f64(out), _reference(*map(f64, (q, k, v)), True, lens), dtype="bf16",
                 reduced=100)
    assert att.spec.dtype == "bf16" and "for n0 in range(" in att.source
    binaries = compiled_kernels(att.fn)
    hopper = torch.cuda.get_device_capability()[0] == 9
    form = r"wgmma\.mma_async\S*\.bf16\.bf16" if hopper else r"mma\.sync\S*\.bf16\.bf16"
    assert binaries and re.search(form, binaries[0].asm["ptx"])


def test_a_row_without_keys_gives_zeros_as_the_ir_op_does():
    out, want, _ = _run("f32", False, [0, 29], shape=(2, 1, 1, 3, 29, 16))
    assert (host(out[0]) == 0).all()
    assert_close(host(out), want, dtype="f32", reduced=29)


@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 32)], ids=lambda b: "x".join(
    map(str, b)))
@pytest.mark.parametrize("lens", [None, [37, 0, 21]], ids=["dense", "padded"])
def test_unmasked_and_diagonal_key_blocks_over_several_query_blocks(blocks, lens):
    # 3 query blocks or more: blocks below the diagonal run unmasked, the diagonal and the
    # key tail (37 keys, padded to 21 or none) masked, the heaviest query block first
    b, hq, sq, sk, d = 3, 2, 37, 37, 16
    q, k, v = (tensor(RNG.standard_normal((b, hq, s, d)).astype(np.float32))
               for s in (sq, sk, sk))
    att = TritonAttention("f32", causal=True, padded=lens is not None)
    kv = None if lens is None else tensor(np.array(lens, np.int32))
    out = att(q, k, v, kv_lens=kv, block_m=blocks[0], block_n=blocks[1])
    want = _reference(*map(f64, (q, k, v)), True, lens)
    assert_close(host(out), want, dtype="f32", reduced=sk)
    if lens is None:  # the unread lengths are made once a device, not per call
        assert att._no_lengths and att(q, k, v) is not None and len(att._no_lengths) == 1


def test_the_source_masks_only_the_diagonal_and_tail_blocks():
    from tilefold.codegen.triton.attention import emit_attention

    src = emit_attention(AttentionSpec("bf16", causal=True))
    unmasked, masked = src.split("for n0 in range(")[1:]
    assert "valid" not in unmasked and "n_mask" not in unmasked
    assert "rn[None, :] <= rm[:, None]" in masked
    assert "tl.exp2(s - m_use[:, None])" in src and "_tf_exp" not in src
    assert "- 1 - tl.program_id(1)" in src  # causal: the last query block first


def test_bad_input_is_a_clear_error():
    q = torch.zeros(1, 3, 4, 8)
    with pytest.raises(ShapeError, match="heads dividing"):
        TritonAttention("f32")(q, torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8))
    with pytest.raises(UnsupportedError, match="kv_lens"):
        TritonAttention("f32")(q, torch.zeros(1, 1, 5, 8), torch.zeros(1, 1, 5, 8),
                               kv_lens=torch.tensor([5], dtype=torch.int32))
    with pytest.raises(UnsupportedError, match="one of f32"):
        AttentionSpec("fp8e4m3")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_sm_90_ptx_uses_wgmma_for_both_products(dtype):
    report = compile_attention_ptx(AttentionSpec(dtype, causal=True), H200)
    forms = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", report["ptx"]))
    assert forms == {"64", "128"}  # scores over 64 keys, then P V over D = 128
    assert 0 < report["shared"] <= H200.shared_memory_per_block
    assert report["spills"] == 0


SDPA = """module {
  func @main(%q: f32[1,4,9,16], %k: f32[1,2,21,16], %v: f32[1,2,21,16]) -> (f32[1,4,9,16]) {
    %0 = scaled_dot_product_attention(%q, %k, %v) {is_causal = true, enable_gqa = true,
                                                   scale = 0.3} : f32[1,4,9,16]
    return(%0)
  }
}
"""


def test_the_ir_op_runs_through_the_backend_with_its_attributes():
    from tilefold.codegen.backend import get_backend
    from tilefold.ir import parse_module

    (op, _) = parse_module(SDPA).functions["main"].body.ops
    q, k, v = (RNG.standard_normal(s).astype(np.float32)
               for s in ((1, 4, 9, 16), (1, 2, 21, 16), (1, 2, 21, 16)))
    out = get_backend("triton").attention(op, H200)(
        *map(tensor, (q, k, v)), block_m=16, block_n=16)
    group = 2
    kk, vv = np.repeat(k, group, axis=1).astype(np.float64), np.repeat(v, group, axis=1)
    s = np.where(np.tril(np.ones((9, 21), bool)), q.astype(np.float64) @ kk.swapaxes(-1, -2)
                 * 0.3, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert_close(host(out), (p / p.sum(-1, keepdims=True)) @ vv, dtype="f32", reduced=21)


def test_ops_the_template_lacks_are_named():
    from tilefold.codegen.triton.attention_op import attention_spec
    from tilefold.ir import parse_module

    masked = SDPA.replace("%v) {", "%v, %m) {").replace(
        "%v: f32[1,2,21,16])", "%v: f32[1,2,21,16], %m: bool[9,21])")
    (op, _) = parse_module(masked).functions["main"].body.ops
    with pytest.raises(UnsupportedError, match="a mask tensor is not in the Triton template"):
        attention_spec(op)
