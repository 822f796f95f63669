"""`tilefold bench train`'s plumbing on a short MiniLM-shaped step (no timing asserted): the
contenders' step times, first-step losses that agree (without dropout), and the graphs
tilefold ran natively (with dropout too)."""

from __future__ import annotations

import json

import pytest

from tilefold.cli.main import main


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_bench_train_times_each_contender_and_checks_the_loss(tmp_path, capsys,
                                                              restore_threads, dropout):
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--models", "minilm", "--batch", "1", "--seq", "8",
                 "--rounds", "1", "--threads", "1", "--no-inductor", "--rss-steps", "0",
                 "--dropout", str(dropout), "--json", str(out)]) == 0
    assert "step time" in capsys.readouterr().out
    data = json.loads(out.read_text())
    (section,) = data["sections"]
    (row,) = section["rows"]
    assert set(row["contenders"]) == {"tilefold", "eager"}
    assert all(c["interleaved_s"] > 0 and c["alone_s"] > 0 for c in row["contenders"].values())
    minilm = data["models"]["minilm"]
    losses = minilm["first_loss"]
    if not dropout:  # with dropout each contender draws its own masks
        assert abs(losses["tilefold"] - losses["eager"]) < 1e-4
    modes = [g.split(":")[1].split(",")[0].strip() for g in minilm["graphs"]]
    # forward, backward (with dropout's masks too) and the AdamW step (its first and its
    # steady graph), all in tilefold
    assert len(modes) >= 3 and set(modes) == {"tilefold"}, minilm["graphs"]


def test_the_child_reports_its_peak_rss_and_its_first_step(capsys, restore_threads):
    """The per-contender child (`python -m tilefold.cli.bench_train`) gives both figures the
    table compares: its own process's peak RSS and its first step's seconds."""
    from tilefold.cli import bench_train

    bench_train.main(["minilm", "eager", "1", "8", "2", "1", "1", "1", "0.0"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["peak_rss_bytes"] > 1 << 20
    assert 0 < figures["first_step_s"] < bench_train.CHILD_TIMEOUT_S
