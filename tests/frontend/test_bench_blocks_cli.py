"""`tilefold bench blocks` on its smallest block, one round: every contender timed interleaved
and alone, tilefold's output checked against eager."""

from __future__ import annotations

import json

import pytest

from tilefold.cli.main import main

pytestmark = pytest.mark.usefixtures("restore_threads")


def test_softmax_block_against_numpy_and_eager(tmp_path, capsys):
    out = tmp_path / "blocks.json"
    assert main(["bench", "blocks", "--only", "softmax-12x128x128", "--rounds", "1",
                 "--threads", "1", "--no-torch-compile", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vs numpy" in text and "vs eager" in text and "MISMATCH" not in text
    (section,) = json.loads(out.read_text())["sections"]
    assert (section["unit"], section["threads"]) == ("ms", 1)
    (row,) = section["rows"]
    assert row["case"] == "softmax-12x128x128" and row["max_rel_err_vs_eager"] < 1e-5
    assert set(row["contenders"]) == {"tilefold", "numpy", "eager"}
    assert all(c["interleaved_s"] > 0 and c["alone_s"] > 0 for c in row["contenders"].values())
