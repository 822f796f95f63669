"""`tilefold demo`: the missing-extras message, and a small config-built run end to end."""

from __future__ import annotations

import argparse

import pytest

from tilefold.frontend import demo


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


def test_missing_extras_print_the_install_command(monkeypatch, capsys):
    monkeypatch.setattr(demo, "missing_packages", lambda model: ["transformers"])
    args = _args()
    assert args.handler(args) == 2
    out = capsys.readouterr().out
    assert "transformers" in out and 'pip install -e ".[demo]"' in out


def test_config_model_demo_runs_and_prints_the_table(capsys):
    pytest.importorskip("transformers")
    args = _args("--model", "bert", "--layers", "1", "--batch", "1", "--seq", "8", "--runs", "1",
                 "--no-inductor")
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "tilefold" in out and "PyTorch eager" in out and "ops by kernel method" in out
