"""Print -> parse -> print is the identity: random graphs, constants of every dtype, IR files."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_strategies import CORE_OPS, bit_arrays, modules, random_array

from tilefold import dtypes
from tilefold.errors import TilefoldError
from tilefold.ir import (
    Builder,
    Module,
    first_difference,
    interpret,
    parse_module,
    print_module,
    printer,
    verify,
)

REPO = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", ".venv", "venv", "build", "dist", "Output", "node_modules", ".tox"}
SPLIT = re.compile(r"^// -----\s*$", re.MULTILINE)
# Input written to fail says so, and the lit suite checks its diagnostics instead: a chunk with an
# `expected-error` or a `// INVALID` line, or a whole file run with --verify-diagnostics.
INVALID = re.compile(r"expected-error|^\s*//\s*INVALID\b", re.MULTILINE)
DIAGNOSTICS_FILE = re.compile(r"^//\s*RUN:.*--verify-diagnostics", re.MULTILINE)


def assert_round_trip(module: Module, **io) -> Module:
    """Print, parse, verify and print again: same text, same graph; returns the parsed module."""
    text = print_module(module, **io)
    parsed = verify(parse_module(text, **{k: v for k, v in io.items() if k == "resource_dir"}))
    assert print_module(parsed, **io) == text
    assert first_difference(module, parsed, names=True) is None
    return parsed


def assert_same_outputs(a: Module, b: Module) -> None:
    """Both modules compute the same bits on the same random inputs (or fail the same way)."""
    rng = np.random.default_rng(0)
    for name, fn in a.functions.items():
        inputs = [random_array(rng, arg.type) for arg in fn.args]
        try:
            expected = interpret(a, *inputs, function=name)
        except TilefoldError as exc:  # e.g. a gather index out of range: a user error, not a bug
            with pytest.raises(type(exc)):
                interpret(b, *inputs, function=name)
            continue
        got = interpret(b, *inputs, function=name)
        assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]


@pytest.mark.parametrize("focus", CORE_OPS)
@settings(max_examples=10)
@given(data=st.data())
def test_random_graphs_round_trip(focus: str, data) -> None:
    module = data.draw(modules(focus=focus))
    parsed = assert_round_trip(module)
    assert_same_outputs(module, parsed)


@given(modules(max_ops=12))
@settings(max_examples=60)
def test_random_multi_op_graphs_round_trip_through_side_files(module: Module) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assert_round_trip(module, resource_dir=tmp, file_limit=4)


@pytest.mark.parametrize("dt", dtypes.ALL_DTYPES, ids=str)
@settings(max_examples=20)
@given(data=st.data())
def test_constants_are_bit_exact(dt: dtypes.DType, data) -> None:
    shape = tuple(data.draw(st.lists(st.integers(0, 5), max_size=3)))
    value = data.draw(bit_arrays(dt, shape))
    b = Builder()
    module = b.build(b.constant(value))
    with tempfile.TemporaryDirectory() as tmp:
        for io in ({}, {"resource_dir": tmp, "file_limit": 0}):
            parsed = assert_round_trip(module, **io)
            stored = parsed["main"].ops[0].attrs["value"]
            assert stored.dtype == value.dtype and stored.shape == value.shape
            assert stored.tobytes() == value.tobytes()


def test_external_constants_print_as_names_and_parse_from_bound_arrays() -> None:
    """Weights kept out of the text (the graph cache): printed by name, bound when parsed."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = Builder()
    x = b.arg("x", "f32", (3, 6))
    module = b.build(x @ b.constant(w))
    stored = module["main"].ops[0].attrs["value"]
    text = print_module(module, external={id(stored): "input:1"})
    assert 'file "input:1"' in text and len(text) < 300
    other = rng.standard_normal((6, 4)).astype(np.float32)
    parsed = verify(parse_module(text, bound={"input:1": other}))
    np.testing.assert_array_equal(parsed["main"].ops[0].attrs["value"], other)
    with pytest.raises(TilefoldError, match="bound array 'input:1' is float64"):
        parse_module(text, bound={"input:1": other.astype(np.float64)})
    with pytest.raises(TilefoldError, match="pass resource_dir"):
        parse_module(text)


@pytest.mark.parametrize(
    ("values", "dt", "printed"),
    [
        (
            [1.5, -0.0, float("inf"), -float("inf"), float("nan")],
            "f32",
            "[1.5, -0.0, inf, -inf, nan]",
        ),
        ([0.1, 3.0], "bf16", "[0.1, 3.0]"),
        ([2.0] * 4, "f16", "splat 2.0"),
        ([-8, 7, 0], "i4", "[-8, 7, 0]"),
        ([True, False], "bool", "[true, false]"),
        ([448.0, -0.001953125], "fp8e4m3", "[448.0, -0.002]"),
    ],
)
def test_small_constants_print_as_decimals(values, dt, printed) -> None:
    b = Builder()
    text = print_module(b.build(b.constant(values, dtype=dt)))
    assert f"dense<{dt}[{len(values)}] {printed}>" in text
    assert_round_trip(parse_module(text))


def test_nan_payloads_print_as_hex() -> None:
    b = Builder()
    payload = np.array([0x7FC00001], np.uint32).view(np.float32)
    text = print_module(b.build(b.constant(payload)))
    assert "dense<f32[1] 0x0100C07F>" in text


def ir_chunks() -> list[tuple[str, str]]:
    """(id, text) of every IR module in the repository's .tfir/.mlir files, split at `// -----`."""
    chunks = []
    for path in sorted([*REPO.rglob("*.tfir"), *REPO.rglob("*.mlir")]):
        if SKIPPED_DIRS & set(path.relative_to(REPO).parts):
            continue
        text = path.read_text()
        if DIAGNOSTICS_FILE.search(text):
            continue
        for i, chunk in enumerate(SPLIT.split(text)):
            if chunk.strip() and not INVALID.search(chunk):
                chunks.append((f"{path.relative_to(REPO)}#{i}", chunk))
    return chunks


@pytest.mark.parametrize(("where", "text"), ir_chunks(), ids=lambda v: v if "/" in v else "")
def test_repository_ir_files_round_trip(where: str, text: str) -> None:
    module = verify(parse_module(text, where))
    assert_round_trip(module)


def test_repository_has_ir_files() -> None:
    assert any(where.startswith("examples/") for where, _ in ir_chunks())


def test_the_grammar_example_in_the_printer_prints_back_verbatim() -> None:
    lines = [line[4:] for line in printer.__doc__.splitlines() if line.startswith("    ")]
    example = "\n".join(lines) + "\n"
    assert print_module(verify(parse_module(example))) == example


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_nans_of_either_sign_print_as_decimals_and_read_back_bit_exactly(dtype):
    """FPUs differ in the sign of the NaNs they make (x86 gives -nan for log(-1), others +nan):
    the text must show both, so folded constants print the same way on every host."""
    values = np.array([np.nan, 1.5, -np.inf, np.nan], dtype)
    values[3] = -values[3]
    b = Builder("main")
    text = print_module(b.build(b.constant(values)))
    assert "[nan, 1.5, -inf, -nan]" in text
    back = parse_module(text)["main"].ops[0].attrs["value"]
    assert back.tobytes() == values.tobytes()
