"""`tilefold emit`: Triton source of each memory-bound group of an IR file and the GEMM template
of each compute group, groups the backend refuses named with the reason, PTX for sm_90 without
a GPU, and a clear error without Triton."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tilefold.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NORMS = str(EXAMPLES / "norms.tfir")
LINEAR_GELU = str(EXAMPLES / "linear_gelu.tfir")
MLP = str(EXAMPLES / "mlp.tfir")
ATTENTION = str(EXAMPLES / "attention.tfir")
POW = """module {
  func @main(%x: f32[3,5], %y: f32[3,5]) -> (f32[3,5]) {
    %0 = pow(%x, %y) : f32[3,5]
    %1 = exp(%0) : f32[3,5]
    return(%1)
  }
}
"""


def test_emit_prints_each_memory_group_s_source(capsys):
    assert main(["emit", NORMS, "--target", "h200"]) == 0
    out = capsys.readouterr().out
    assert "3 memory-bound group(s)" in out
    assert "# group 1/3: add -> rms_norm -> softmax" in out
    assert out.count("@triton.jit\ndef fused(") == 3
    compile(out, "emitted", "exec")  # the whole listing is Python


def test_emit_names_what_the_backend_refuses(tmp_path, capsys):
    path = tmp_path / "pow.tfir"
    path.write_text(POW)
    assert main(["emit", str(path)]) == 0
    assert "# not emitted: the Triton backend has no form for pow yet" in capsys.readouterr().out


def test_emit_refuses_an_unknown_target(capsys):
    assert main(["emit", NORMS, "--target", "b200"]) == 1
    assert "no GPU target named 'b200'" in capsys.readouterr().err


def test_ptx_without_triton_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "triton", None)
    assert main(["emit", NORMS, "--ptx"]) == 1
    assert "needs Triton: pip install 'tilefold[triton]'" in capsys.readouterr().err


def test_ptx_summary_for_sm_90(capsys):
    pytest.importorskip("triton", reason="Triton is an optional extra")
    assert main(["emit", NORMS, "--ptx", "--summary"]) == 0
    out = capsys.readouterr().out
    assert out.count("// sm_90 BLOCK_R=") == 3 and out.count(" 0 bytes spilled") == 3


def test_emit_prints_the_gemm_template_of_a_compute_group(capsys):
    assert main(["emit", LINEAR_GELU, "--target", "h200"]) == 0
    out = capsys.readouterr().out
    assert "0 memory-bound group(s), 1 compute group(s)" in out
    assert "# group 1/1: matmul -> add -> gelu (compute)" in out
    assert "# listed for ?tokens = 128" in out
    assert out.count("@triton.jit\ndef tf_gemm(") == 1
    body = out[out.index("def tf_gemm("):]
    # the bias is one value per column, C and each op's result rounded to bf16, GELU by erf
    assert "e1_ptr + rn[None, :], mask=n_mask" in body
    assert "c = _tf_round_bf16(acc)" in body and "tl.erf(" in body
    assert "for i in range(0, K_ITERS):" in body  # compiled form: a pipelined K loop
    compile(out, "emitted", "exec")


def test_emit_names_an_epilogue_the_template_refuses(capsys):
    assert main(["emit", MLP, "--target", "h200"]) == 0
    out = capsys.readouterr().out
    assert "# group 2/2: matmul -> add -> layer_norm -> softmax (compute)" in out
    assert "# not emitted: Triton GEMM (f32 x f32): the epilogue reduces along C's rows" in out


def test_gemm_ptx_summary_for_sm_90(capsys):
    pytest.importorskip("triton", reason="Triton is an optional extra")
    assert main(["emit", LINEAR_GELU, "--ptx", "--summary"]) == 0
    out = capsys.readouterr().out
    assert out.count("// sm_90 GEMM BLOCK_M=") == 1 and " 0 bytes spilled" in out


def test_emit_prints_the_attention_template_of_an_attention_op(capsys):
    assert main(["emit", ATTENTION, "--target", "h200"]) == 0
    out = capsys.readouterr().out
    assert "0 compute group(s), 1 attention op(s)" in out
    assert "# group 1/1: scaled_dot_product_attention (attention)" in out
    assert "def tf_attention(" in out and "causal=True" in out
    compile(out, "emitted", "exec")


def test_templates_are_not_emitted_for_an_amd_target(capsys):
    assert main(["emit", ATTENTION, "--target", "mi300x"]) == 0
    assert main(["emit", LINEAR_GELU, "--target", "mi300x"]) == 0
    out = capsys.readouterr().out
    assert "# not emitted: the Triton attention template is for NVIDIA GPU targets" in out
    assert "# not emitted: the Triton GEMM template is for NVIDIA GPU targets" in out
