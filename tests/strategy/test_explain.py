"""`tilefold explain` shows every method family for each group, the winner and why."""

from __future__ import annotations

import argparse

from tilefold.cli import explain
from tilefold.strategy import FAMILIES

MLP = """func @main(%x: f32[?batch,32], %w1: f32[32,64], %b1: f32[64], %w2: f32[64,32],
                  %b2: f32[32]) -> (f32[32,?batch]) {
  %0 = matmul(%x, %w1) : f32[?batch,64]
  %1 = add(%0, %b1) : f32[?batch,64]
  %2 = gelu(%1) : f32[?batch,64]
  %3 = matmul(%2, %w2) : f32[?batch,32]
  %4 = add(%3, %b2) : f32[?batch,32]
  %5 = softmax(%4) : f32[?batch,32]
  %6 = transpose(%5) {perm = [1, 0]} : f32[32,?batch]
  return(%6)
}"""


def test_explain_lists_all_families_and_the_winner(tmp_path, capsys):
    path = tmp_path / "mlp.tfir"
    path.write_text(MLP)
    parser = argparse.ArgumentParser()
    explain.add_parser(parser.add_subparsers())
    args = parser.parse_args(["explain", str(path), "--bind", "batch=8", "--kernel-ir"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("group ") for line in out.splitlines()) == 2
    assert "# layout: %6 is a view of its operand (no kernel, no copy)" in out
    for family in FAMILIES:
        assert family in out
    assert "not applicable:" in out and "winner: blocks.gemm" in out
    assert "fusion: not fusing %6 (transpose)" in out
    assert "tf_epilogue_" in out
