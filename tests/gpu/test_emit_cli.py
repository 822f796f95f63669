"""`tilefold emit`: Triton source of each memory-bound group of an IR file, groups the backend
refuses named with the reason, PTX for sm_90 without a GPU, and a clear error without Triton."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tilefold.cli.main import main

NORMS = str(Path(__file__).resolve().parents[2] / "examples" / "norms.tfir")
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
