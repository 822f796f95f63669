"""`tilefold tune FILE`: measures each group now, keeps the winners, reuses them, and measures
them anew with --again; bad arguments are clear errors."""

from __future__ import annotations

import os

import pytest

from tilefold.cli.main import main
from tilefold.errors import TilefoldError
from tilefold.strategy.tuning_db import TuningDB

MLP = """func @main(%x: f32[?batch,64], %w: f32[64,96], %b: f32[96]) -> (f32[?batch,96]) {
  %0 = matmul(%x, %w) : f32[?batch,96]
  %1 = add(%0, %b) : f32[?batch,96]
  %2 = gelu(%1) : f32[?batch,96]
  return(%2)
}"""


def _tune(path, capsys, *extra: str) -> str:
    assert main(["tune", str(path), "--bind", "batch=16", "--budget", "0.2", *extra]) == 0
    return capsys.readouterr().out


def test_tune_measures_keeps_and_measures_again(tmp_path, capsys, allow_fallback):
    path = tmp_path / "mlp.tfir"
    path.write_text(MLP)
    before = {k: os.environ.get(k) for k in ("TILEFOLD_TUNE", "TILEFOLD_RETUNE")}

    out = _tune(path, capsys)
    assert "group 1: matmul -> add -> gelu on (f32[16,64], f32[64,96], f32[96]) x1, " \
           "measured now" in out
    winner = next(line for line in out.splitlines() if line.startswith("  * "))
    assert "extern.numpy{}" in out and " ms" in winner
    entries = TuningDB().entries()
    assert len(entries) == 1

    assert "x1, from the tuning database" in _tune(path, capsys)
    assert "x1, measured now" in _tune(path, capsys, "--again")
    assert len(TuningDB().entries()) == 1  # replaced, not added
    assert {k: os.environ.get(k) for k in before} == before


@pytest.mark.parametrize("argv, message", [
    (["tune"], "an IR file, --model NAME, --gemm or --comm"),
    (["tune", "x.tfir", "--model", "bert"], "an IR file, --model NAME, --gemm or --comm"),
    (["tune", "x.tfir", "--budget", "0"], "positive number of seconds"),
])
def test_tune_refuses_unclear_requests(argv, message, capsys):
    assert main(argv) == 1
    assert message in capsys.readouterr().err
    with pytest.raises(TilefoldError, match=message):
        main(["--debug", *argv])
