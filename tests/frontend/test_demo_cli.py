"""`tilefold demo`: the missing-extras message, and a small config-built run end to end."""

from __future__ import annotations

import argparse

import pytest

from tilefold.cli import demo, models


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


def test_missing_extras_print_the_install_command(monkeypatch, capsys):
    monkeypatch.setattr(models, "missing_packages", lambda model: ["transformers"])
    args = _args()
    assert args.handler(args) == 2
    out = capsys.readouterr().out
    assert "transformers" in out and 'pip install -e ".[demo]"' in out


def test_config_model_demo_runs_and_prints_the_table(capsys):
    pytest.importorskip("transformers")
    args = _args("--model", "bert", "--layers", "1", "--batch", "1", "--seq", "8",
                 "--rounds", "1", "--no-inductor")
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "ops by kernel method" in out and "interleaved/alone" in out
    lines = out.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("model ")))
    assert lines[head].split()[1:4] == ["tilefold", "PyTorch", "eager"]
    latency = lines[head + 1].split()  # bert, tilefold's ms/ms, eager's, its speedup
    assert latency[0] == "bert" and all(float(v) > 0 for v in latency[1].rstrip("!").split("/"))
    cold_warm = next(line for line in out.splitlines() if line.startswith("tilefold "))
    cold, warm = (float(v) for v in cold_warm.split()[1:3])  # compile s in new processes
    assert cold >= 0 and warm >= 0
