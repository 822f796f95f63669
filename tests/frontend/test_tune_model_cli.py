"""`tilefold tune --model`: a one-layer BERT compiled with measurement on, each distinct group
listed with its measured candidates, and the winners kept in the tuning database."""

from __future__ import annotations

import pytest

from tilefold.cli.main import main
from tilefold.strategy.tuning_db import TuningDB

pytest.importorskip("transformers")


def test_tune_a_model_lists_groups_and_fills_the_database(tmp_path, monkeypatch, capsys,
                                                         allow_fallback):
    """extern runs attention on its reference, a contender only outside strict mode."""
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    assert main(["tune", "--model", "bert", "--layers", "1", "--batch", "1", "--seq", "8",
                 "--budget", "0.2"]) == 0
    out = capsys.readouterr().out
    attention = next(line for line in out.splitlines()
                     if "scaled_dot_product_attention on (f32[1,12,8,64]" in line)
    assert attention.endswith("x1, measured now")
    groups = sum(line.startswith("group ") for line in out.splitlines())
    assert groups >= 5 and f"{groups} distinct group(s): {groups} measured now" in out
    assert len(TuningDB().entries()) == groups
