"""`tilefold opt` takes the pass driver's flags anywhere on its command line, as
`python -m tilefold.passes` does."""

from __future__ import annotations

from tilefold.cli.main import main

TWICE = """func @main(%x: f32[4]) -> (f32[4]) {
  %0 = exp(%x) : f32[4]
  %1 = exp(%x) : f32[4]
  %2 = add(%0, %1) : f32[4]
  return(%2)
}
"""


def test_flags_before_the_file_reach_the_driver(tmp_path, capsys):
    path = tmp_path / "twice.tfir"
    path.write_text(TWICE)
    assert main(["opt", "-p", "cse", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("exp(%x)") == 1 and "add(%0, %0)" in out  # cse ran
    assert main(["opt", "--list-passes"]) == 0
    assert "Pipelines:" in capsys.readouterr().out


def test_debug_before_or_after_opt_shows_the_traceback(tmp_path, capsys):
    path = tmp_path / "bad.tfir"
    path.write_bytes(b"\xff")
    for argv in (["--debug", "opt", str(path)], ["opt", "--debug", str(path)]):
        assert main(argv) == 1
        assert "Traceback" in capsys.readouterr().err
