"""Bad input to `tilefold opt`, `run`, `explain` and `tune`: exit status 1 and one message on
stderr that names the problem (and where it is, with a caret line), never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tilefold
from tilefold.cli.main import main

SRC = Path(tilefold.__file__).resolve().parents[1]  # the tilefold these tests import

GOOD = """func @main(%x: f32[?n,4], %w: f32[4,4]) -> (f32[?n,4]) {
  %0 = matmul(%x, %w) : f32[?n,4]
  %1 = exp(%0) : f32[?n,4]
  return(%1)
}
"""
CONSTANT = """func @main(%x: f32[2,2]) -> (f32[2,2]) {
  %c = constant() {value = dense<f32[2,2] [1.0, 2.0, 3.0, 4.0]>} : f32[2,2]
  %0 = add(%x, %c) : f32[2,2]
  return(%0)
}
"""
# An outer sum: small inputs, an intermediate of n*n elements.
OUTER = """func @main(%x: f32[?n,1], %y: f32[1,?n]) -> (f32[?n]) {
  %0 = add(%x, %y) : f32[?n,?n]
  %1 = reduce_sum(%0) {axes = [1]} : f32[?n]
  return(%1)
}
"""
HUGE = "99999999999999,99999999999"

# name -> (file bytes, or None for no file; the message; (line, col) of the caret or None)
BAD_FILES: dict[str, tuple[bytes | None, str, tuple[int, int] | None]] = {
    "missing": (None, "No such file or directory", None),
    "empty": (b"", "is empty", None),
    "blank": (b"\n   \n\t\n", "is empty", None),
    "latin-1": (GOOD.replace("%1 = exp", "// caf\xe9\n  %1 = exp").encode("latin-1"),
                "byte 0xe9 is not UTF-8", (3, 9)),
    "binary": (bytes(np.random.default_rng(0).integers(0, 256, 512, dtype=np.uint8)),
               "is not UTF-8", None),
    "nul": (GOOD.encode().replace(b"  %1", b"\x00\x1b[2J  %1"), "a NUL character", (3, 1)),
    "cut in a character": (GOOD.encode() + "// \u00b5".encode()[:-1],
                           "ends inside a UTF-8 character", (6, 4)),
    "cut in an op": (GOOD[:GOOD.index("(%x, %w)")].encode(),
                     "expected '(' after op name 'matmul', found 'end of input'", (2, 14)),
    "cut in a dense constant": (CONSTANT[:CONSTANT.index(", 3.0")].encode(),
                                "expected ']', found 'end of input'", (2, 52)),
    "cut in a func": (GOOD[:GOOD.index("  return")].encode(), "missing '}'", (3, 27)),
    "negative dim": (GOOD.replace("?n,4]", "-3,4]").encode(), "cannot be negative", (1, 20)),
    "absurd dims": (f"func @main(%x: f32[{HUGE}]) -> (f32[{HUGE}]) {{\n"
                    f"  %0 = exp(%x) : f32[{HUGE}]\n  return(%0)\n}}\n".encode(),
                    "is too large: it would take 4e+25 bytes, past what 64-bit offsets address",
                    (1, 16)),
    "dim past 64 bits": (GOOD.replace("?n,4]", "?n,99999999999999999999]").encode(),
                         "above 2**63-1", (1, 23)),
    "absurd constant": (CONSTANT.replace("[1.0, 2.0, 3.0, 4.0]", "splat 1.0")
                        .replace("dense<f32[2,2]", f"dense<f32[{HUGE}]").encode(),
                        "is too large", (2, 34)),
    "unknown dtype": (GOOD.replace("%w: f32", "%w: f33").encode(), "unknown dtype 'f33'",
                      (1, 31)),
}
TOOLS = {
    "opt": [],
    "run": ["--bind", "n=2"],
    "explain": ["--bind", "n=2"],
    "tune": ["--bind", "n=2", "--budget", "0.05"],
}


def fails(argv: list[str], capsys) -> str:
    """The stderr of `tilefold ARGV`, which must exit 1 with no traceback."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip(), err
    return err


def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_bad_file_is_one_located_error(kind, tool, tmp_path, capsys):
    content, message, where = BAD_FILES[kind]
    path = str(tmp_path / "bad.tfir")
    if content is not None:
        write(tmp_path, "bad.tfir", content)
    err = fails([tool, path, *TOOLS[tool]], capsys)
    assert message in err, err
    if where is not None:
        line, col = where
        first, quoted, caret = err.splitlines()[:3]
        assert f"{path}:{line}:{col}: error: " in first, err
        assert caret == " " * (col - 1) + "^", err
        assert quoted.isprintable(), quoted  # binary junk is shown as U+FFFD, not sent raw


@pytest.mark.parametrize("tool", TOOLS)
def test_a_directory_is_not_an_ir_file(tool, tmp_path, capsys):
    assert "is a directory, not an IR file" in fails([tool, str(tmp_path), *TOOLS[tool]], capsys)


def test_an_unknown_function_lists_those_the_file_has(tmp_path, capsys):
    path = write(tmp_path, "good.tfir", GOOD)
    for tool in ("run", "explain"):
        err = fails([tool, path, "--function", "nope", "--bind", "n=2"], capsys)
        assert "has no function @nope (it has: @main)" in err


def save(tmp_path: Path, name: str, array: np.ndarray) -> str:
    path = tmp_path / name
    np.save(path, array)
    return str(path)


@pytest.fixture
def run_args(tmp_path):
    """`run GOOD` argv with a helper to make .npy inputs."""
    path = write(tmp_path, "good.tfir", GOOD)
    rng = np.random.default_rng(1)

    def npy(name: str, shape: tuple, dtype=np.float32) -> str:
        return save(tmp_path, name, rng.standard_normal(shape).astype(dtype))

    return path, npy


@pytest.mark.parametrize("extra, message", [
    ([], "symbolic dims without a size: ?n; give each one, e.g. --bind n=8"),
    (["--bind", "n=-1"], "--bind n=-1: a size is a whole number >= 0"),
    (["--bind", "n=2.5"], "--bind n=2.5: a size is a whole number >= 0"),
    (["--bind", "m=3"], "@main has no dim ?m (its dims are ?n)"),
    (["--bind", "n"], "--bind expects NAME=VALUE, got 'n'"),
    (["--bind", "n=2", "--bind", "?n=3"], "--bind gives ?n twice (2 and 3)"),
    (["--bind", "n=99999999999999999"], "argument %x of type f32[?n,4] = "
     "f32[99999999999999999,4] is too large"),
    (["--bind", "n=2", "--input", "q=q.npy"], "@main has no argument(s) %q (it has: %x, %w)"),
])
def test_run_refuses_bad_bindings(extra, message, run_args, capsys):
    path, _ = run_args
    assert message in fails(["run", path, *extra], capsys)


@pytest.mark.parametrize("inputs, message", [
    ({"x": ((5,), np.float32)}, "has shape [5], but %x is f32[?n,4] (rank 2)"),
    ({"x": ((3, 4), np.float64)}, "holds float64 elements, but %x is f32[?n,4]; convert it"),
    ({"w": ((4, 5), np.float32)}, "has shape [4, 5], but %w is f32[4,4]"),
    ({"x": ((3, 4), np.float32), "bind": 5},
     "so ?n = 3 for %x (f32[?n,4]), but --bind n=5 makes it 5"),
])
def test_run_refuses_inputs_that_do_not_fit(inputs, message, run_args, tmp_path, capsys):
    path, npy = run_args
    argv = ["run", path]
    for name, spec in inputs.items():
        argv += (["--bind", f"n={spec}"] if name == "bind"
                 else ["--input", f"{name}={npy(name + '.npy', *spec)}"])
    assert message in fails(argv, capsys)


def test_run_refuses_files_that_are_not_arrays(run_args, tmp_path, capsys):
    path, npy = run_args
    full = Path(npy("cut.npy", (64, 4)))
    full.write_bytes(full.read_bytes()[:-100])
    notnpy = write(tmp_path, "text.npy", "hello")
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{}, None], dtype=object), allow_pickle=True)
    for given, message in [
        (notnpy, "text.npy is not a .npy file (numpy.save writes them)"),
        (str(tmp_path / "none.npy"), "cannot read"),
        (str(tmp_path), "cannot read"),
        (str(objects), "holds object elements, but %x is f32[?n,4]"),
        (str(full), "--input x: cannot load"),
    ]:
        assert message in fails(["run", path, "--input", f"x={given}"], capsys), given


def test_run_with_given_inputs_matches_numpy(run_args, tmp_path, capsys):
    path, npy = run_args
    x, w = npy("x.npy", (3, 4)), npy("w.npy", (4, 4))
    out = tmp_path / "out"
    assert main(["run", path, "--input", f"x={x}", "--input", f"%w={w}",
                 "--output-dir", str(out)]) == 0
    want = np.exp(np.load(x).astype(np.float64) @ np.load(w).astype(np.float64))
    np.testing.assert_allclose(np.load(out / "1.npy"), want, rtol=1e-5)
    assert "cannot write" in fails(["run", path, "--input", f"x={x}", "--input", f"w={w}",
                                    "--output-dir", x], capsys)


def test_run_reads_bf16_arrays_numpy_saved_as_raw_bytes(tmp_path, capsys):
    path = write(tmp_path, "neg.tfir", "func @main(%x: bf16[?n]) -> (bf16[?n]) {\n"
                 "  %0 = neg(%x) : bf16[?n]\n  return(%0)\n}\n")
    x = np.random.default_rng(2).standard_normal(7).astype(ml_dtypes.bfloat16)
    given = save(tmp_path, "x.npy", x)
    assert np.load(given).dtype.kind == "V"  # what numpy.save makes of bfloat16
    out = tmp_path / "out"
    assert main(["run", path, "--input", f"x={given}", "--output-dir", str(out)]) == 0
    got = np.load(out / "0.npy").view(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(got, -x.astype(np.float64))


def test_static_shapes_past_memory_are_refused(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "big.tfir", GOOD.replace("?n", "99999999999999"))
    monkeypatch.setenv("TILEFOLD_MAX_BUFFER_BYTES", str(1 << 30))
    assert main(["opt", path]) == 0  # only text: nothing is allocated
    for tool in ("run", "explain"):
        err = fails([tool, path], capsys)
        assert "argument %x of type f32[99999999999999,4] is too large: it would take 1.42 PiB, " \
               "more than one buffer may take here (1 GiB;" in err


def test_values_past_the_memory_limit_are_refused_before_allocation(tmp_path, monkeypatch,
                                                                     capsys):
    path = write(tmp_path, "outer.tfir", OUTER)
    monkeypatch.setenv("TILEFOLD_MAX_BUFFER_BYTES", "4096")
    for tool in ("run", "explain"):
        err = fails([tool, path, "--bind", "n=40"], capsys)  # %0 takes 40*40*4 = 6400 bytes
        first, quoted, caret = err.splitlines()[:3]
        assert f"{path}:2:8: error: %0 (add) of type f32[?n,?n] = f32[40,40] is too large: " \
               "it would take 6.25 KiB, more than one buffer may take here (4 KiB;" in first
        assert quoted == "  %0 = add(%x, %y) : f32[?n,?n]" and caret == " " * 7 + "^"
    out = tmp_path / "out"
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(shape).astype(np.float32) for shape in ((31, 1), (1, 31)))
    assert main(["run", path, "--input", f"x={save(tmp_path, 'x.npy', x)}",  # 3844 bytes
                 "--input", f"y={save(tmp_path, 'y.npy', y)}", "--output-dir", str(out)]) == 0
    want = (x.astype(np.float64) + y.astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(np.load(out / "1.npy"), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("TILEFOLD_MAX_BUFFER_BYTES", "lots")
    assert "TILEFOLD_MAX_BUFFER_BYTES='lots' is not a number of bytes" in fails(
        ["run", path, "--bind", "n=2"], capsys)


@pytest.mark.parametrize("tool", ["explain", "tune"])
def test_explain_and_tune_check_bindings(tool, tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "good.tfir", GOOD)
    monkeypatch.setenv("TILEFOLD_MAX_BUFFER_BYTES", str(1 << 30))
    extra = TOOLS[tool][2:]
    assert "a size is a whole number >= 0" in fails([tool, path, "--bind", "n=-2", *extra],
                                                    capsys)
    assert "has no dim ?batch" in fails([tool, path, "--bind", "batch=2", *extra], capsys)
    err = fails([tool, path, "--bind", "n=1000000000000", *extra], capsys)
    assert "argument %x of type f32[?n,4] = f32[1000000000000,4] is too large" in err


@pytest.mark.parametrize("tool", ["explain", "tune"])
def test_an_unbound_dim_is_said_to_take_the_default(tool, tmp_path, capsys):
    path = write(tmp_path, "exp.tfir", "func @main(%x: f32[?n]) -> (f32[?n]) {\n"
                 "  %0 = exp(%x) : f32[?n]\n  return(%0)\n}\n")
    assert main([tool, path, *TOOLS[tool][2:]]) == 0
    captured = capsys.readouterr()
    assert "note: ?n is not bound: using 128 (--bind n=SIZE)" in captured.err
    assert "f32[128]" in captured.out


@pytest.mark.parametrize("argv, message", [
    (["tune", "--model", "bert", "--batch", "0"], "argument --batch: 0 is less than 1"),
    (["tune", "--model", "bert", "--seq", "x"], "argument --seq: 'x' is not a whole number"),
    (["run", "f.tfir", "--seed", "-1"], "argument --seed: -1 is less than 0"),
])
def test_bad_counts_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_tune_refuses_an_endless_budget(tmp_path, capsys):
    path = write(tmp_path, "good.tfir", GOOD)
    assert "--budget must be a positive number" in fails(["tune", path, "--budget", "inf"],
                                                         capsys)


@pytest.mark.parametrize("tool, kind", [
    ("opt", "binary"), ("run", "absurd dims"), ("explain", "cut in a dense constant"),
    ("tune", "nul"),
])
def test_the_command_prints_no_traceback(tool, kind, tmp_path):
    """The real entry point in a new process: one message, exit status 1."""
    content, message, _ = BAD_FILES[kind]
    path = write(tmp_path, "bad.tfir", content or b"")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "tilefold.cli.main", tool, path, *TOOLS[tool]],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(re.findall(r"error", done.stderr)) == 1, done.stderr
    assert done.stdout == ""
