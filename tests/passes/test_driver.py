"""The opt driver: files and stdin, split input, diagnostics, round-trip check, exit codes."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from tilefold.ir import parse_module
from tilefold.passes import driver
from tilefold.passes.driver import main, split_input

GOOD = """func @f(%x: f32[4]) -> (f32[4]) {
  %0 = neg(%x) : f32[4]
  %1 = neg(%0) : f32[4]
  return(%1)
}
"""
BAD = """func @g(%x: f32[4]) -> (f32[4]) {
  %0 = nope(%x) : f32[4]
  return(%0)
}
"""


@pytest.fixture
def ir(tmp_path: Path):
    def write(text: str, name: str = "in.tfir") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def test_runs_a_pipeline_and_prints(ir, capsys) -> None:
    assert main([ir(GOOD), "-p", "canonicalize"]) == 0
    out = capsys.readouterr().out
    assert "neg" not in out and "return(%x)" in out


def test_no_pipeline_prints_the_input_back(ir, capsys) -> None:
    assert main([ir(GOOD), "--verify-roundtrip"]) == 0
    assert (
        capsys.readouterr().out
        == "module {\n" + "".join("  " + line + "\n" for line in GOOD.splitlines()) + "}\n"
    )


def test_reads_stdin_and_writes_a_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD))
    out = tmp_path / "out.tfir"
    assert main(["-", "-p", "canonicalize", "-o", str(out)]) == 0
    assert "return(%x)" in out.read_text()


def test_errors_exit_1_with_location_and_caret(ir, capsys) -> None:
    path = ir(BAD)
    assert main([path]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:2:8: error: unknown op 'nope'\n  %0 = nope(%x) : f32[4]\n")
    assert "Traceback" not in err


def test_debug_shows_the_traceback_and_the_log(ir, capsys) -> None:
    assert main([ir(BAD), "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    assert main([ir(GOOD), "--debug", "-p", "canonicalize"]) == 0
    assert "tilefold.passes: canonicalize: -(-x) -> x on %1" in capsys.readouterr().err
    assert not logging.getLogger("tilefold.passes").handlers  # nothing left behind


def test_pipeline_errors_and_missing_files_exit_1(ir, capsys) -> None:
    assert main([ir(GOOD), "-p", "cse{x=1}"]) == 1
    assert "error: pass 'cse' has no option 'x'" in capsys.readouterr().err
    assert main(["/no/such/file.tfir"]) == 1
    assert "error: cannot read /no/such/file.tfir" in capsys.readouterr().err


def test_bad_usage_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--no-such-flag"])
    assert info.value.code == 2


def test_split_input_keeps_line_numbers() -> None:
    text = "a\n// -----\nb\nc\n// ----- trailing words\nd"
    chunks = split_input(text)
    assert [c.splitlines() for c in chunks] == [["a"], ["", "", "b", "c"], [""] * 5 + ["d"]]


def test_split_input_file_processes_chunks_alone(ir, capsys) -> None:
    path = ir(GOOD + "// -----\n" + GOOD.replace("@f", "@h"))
    assert main([path, "--split-input-file", "-p", "canonicalize"]) == 0
    out = capsys.readouterr().out
    assert out.count("module {") == 2 and "}\n// -----\nmodule {" in out
    assert main([ir(GOOD + "// -----\n" + BAD), "--split-input-file"]) == 1
    assert ":8:8: error: unknown op 'nope'" in capsys.readouterr().err  # line 8 of the file


def test_verify_diagnostics(ir, capsys) -> None:
    comment = "  // expected-error @+1 {{unknown op 'nope'}}\n"
    expected = BAD.replace("  %0 = nope", comment + "  %0 = nope")
    assert main([ir(expected), "--verify-diagnostics"]) == 0
    assert main([ir(BAD), "--verify-diagnostics"]) == 1
    assert "unexpected error:" in capsys.readouterr().err
    wrong = expected.replace("{{unknown op", "{{unknown type")
    assert main([ir(wrong), "--verify-diagnostics"]) == 1
    err = capsys.readouterr().err
    assert "expected error at line 3 containing \"unknown type 'nope'\" was not produced" in err


def test_verify_roundtrip_catches_a_printer_parser_mismatch(ir, capsys, monkeypatch) -> None:
    def lossy_parse(text: str, file: str = "<string>", resource_dir=None):
        """Reads `neg` back as `abs`, but only when reading printed output."""
        lossy = file.endswith("(printed)")
        return parse_module(text.replace("neg", "abs") if lossy else text, file)

    monkeypatch.setattr(driver, "parse_module", lossy_parse)
    assert main([ir(GOOD), "--verify-roundtrip"]) == 1
    err = capsys.readouterr().err
    assert "print -> parse -> print changed the IR" in err
    assert "-    %1 = neg(%0) : f32[4]\n+    %0 = abs(%x) : f32[4]" in err


def test_reports_and_dumps_go_to_stderr(ir, capsys) -> None:
    assert (
        main(
            [
                ir(GOOD),
                "-p",
                "canonicalize",
                "--timing",
                "--pass-statistics",
                "--print-ir-after=canonicalize",
                "--print-ir-before",
                "canonicalize",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "IR Dump" not in captured.out and "report" not in captured.out
    for text in (
        "IR Dump Before canonicalize",
        "IR Dump After canonicalize",
        "Execution time report",
        "(num-rewrites) 1 - rules applied",
    ):
        assert text in captured.err


def test_list_passes(capsys) -> None:
    assert main(["--list-passes"]) == 0
    out = capsys.readouterr().out
    for text in (
        "canonicalize",
        "max-iterations=<int>",
        "bind=<name=size,...>",
        "statistics: num-folded, num-too-large",
        "default",
        "canonicalize,cse",
    ):
        assert text in out
