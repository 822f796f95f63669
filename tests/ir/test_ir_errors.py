"""Bad input: each mistake is a TilefoldError naming the problem, located with line, column, caret.

A `§` in a case's text marks where the caret must point; it is removed before parsing.
"""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.errors import (
    DTypeError,
    ParseError,
    ShapeError,
    TilefoldError,
    UnsupportedError,
    VerificationError,
)
from tilefold.ir import (
    OPS,
    Builder,
    Function,
    Module,
    Operation,
    TensorType,
    Value,
    interpret,
    parse_module,
    verify,
)

FILE = "bad.tfir"


def located(text: str) -> tuple[str, int, int]:
    """The text without its `§` marker, and the marker's 1-based line and column."""
    before, after = text.split("§")
    line = before.count("\n") + 1
    col = len(before) - (before.rfind("\n") + 1) + 1
    return before + after, line, col


def check_rendering(exc: TilefoldError, source: str, line: int, col: int, message: str) -> None:
    """`file:line:col: error: message`, then the offending line, then a caret under the column."""
    first, shown, caret = str(exc).splitlines()[:3]
    assert first.startswith(f"{FILE}:{line}:{col}: error: "), first
    assert message in first, first
    assert shown == source.splitlines()[line - 1]
    assert caret == " " * (col - 1) + "^"


def fn(body: str, args: str = "%x: f32[4]", results: str = "f32[4]") -> str:
    return f"func @f({args}) -> ({results}) {{\n{body}\n}}\n"


PARSE_ERRORS = {
    "unexpected character": (fn("  §#\n  return(%x)"), "unexpected character '#'"),
    "unterminated string": (fn('  return(%x) loc(§"f.py:1:2)'), "unterminated string"),
    "bad string escape": (fn('  return(%x) loc(§"\\q":1:2)'), "malformed string"),
    "no paren after op": (fn("  %0 = exp §%x : f32[4]"), "expected '(' after op name 'exp'"),
    "unknown op": (fn("  %0 = §bogus(%x) : f32[4]\n  return(%0)"), "unknown op 'bogus'"),
    "undefined value": (fn("  %0 = exp(§%y) : f32[4]"), "use of undefined value %y"),
    "cycle": (
        fn("  %0 = add(%x, §%1) : f32[4]\n  %1 = exp(%0) : f32[4]\n  return(%1)"),
        "use of undefined value %1",
    ),
    "redefined result": (
        fn("  %0 = exp(%x) : f32[4]\n  §%0 = exp(%x) : f32[4]"),
        "redefinition of value %0",
    ),
    "redefined argument": (
        fn("  return(%x)", "%x: f32[4], §%x: f32[4]"),
        "redefinition of value %x",
    ),
    "redefined function": (
        fn("  return(%x)") + "§" + fn("  return(%x)"),
        "redefinition of function @f",
    ),
    "unknown dtype": (fn("  return(%x)", "%x: §f33[4]"), "unknown dtype 'f33'"),
    "not a dim": (fn("  return(%x)", "%x: f32[§a]"), "expected a dimension (an integer)"),
    "negative dim": (fn("  return(%x)", "%x: f32[§-1]"), "dimensions cannot be negative"),
    "float stride": (fn("  return(%x)", "%x: f32[4]{§1.5}"), "expected a stride (an integer)"),
    "stride count": (fn("  return(%x)", "%x: f32[4,4]§{1}"), "1 strides given for a rank-2 type"),
    "no bracket": (fn("  return(%x)", "%x: f32§(4)"), "expected '[' after the dtype"),
    "unknown attribute": (
        fn("  %0 = exp(%x) {§axis = 1} : f32[4]"),
        "'exp' has no attribute 'axis' (it has: none)",
    ),
    "attribute twice": (
        fn("  %0 = softmax(%x) {axis = 0, §axis = 0} : f32[4]"),
        "attribute 'axis' given twice",
    ),
    "ill-typed int": (
        fn("  %0 = softmax(%x) {axis = §1.5} : f32[4]"),
        "attribute 'axis': expected an integer, got 1.5",
    ),
    "ill-typed ints": (
        fn("  %0 = transpose(%x) {perm = §[?n]} : f32[4]"),
        "attribute 'perm': expected a list of integers",
    ),
    "ill-typed bool": (
        fn("  %0 = reduce_sum(%x) {keepdims = §1} : f32[]"),
        "attribute 'keepdims': expected true or false, got 1",
    ),
    "bad choice": (
        fn('  %0 = gelu(%x) {approximate = §"fast"} : f32[4]'),
        "expected one of none, tanh, got 'fast'",
    ),
    "bad dtype attribute": (
        fn("  %0 = cast(%x) {dtype = §f33} : f32[4]"),
        "attribute 'dtype': unknown dtype 'f33'",
    ),
    "missing comma": (
        fn("  %0 = reduce_sum(%x) {axes = [0] §keepdims = true} : f32[1]"),
        "expected ',' between attributes",
    ),
    "no attribute value": (
        fn("  %0 = softmax(%x) {axis = §)} : f32[4]"),
        "expected an attribute value, found ')'",
    ),
    "symbolic dense": (
        fn("  %0 = constant() {value = §dense<f32[?n] splat 1.0>} : f32[?n]"),
        "a dense constant needs a static shape",
    ),
    "odd hex": (
        fn("  %0 = constant() {value = dense<f32[1] §0x123>} : f32[1]"),
        "malformed hex data",
    ),
    "too few elements": (
        fn("  %0 = constant() {value = dense<f32[3] §[1.0, 2.0]>} : f32[3]"),
        "dense constant of type f32[3] holds 2 elements",
    ),
    "int out of range": (
        fn("  %0 = constant() {value = dense<i8[1] [§300]>} : i8[1]"),
        "expected an element of i8, found '300'",
    ),
    "number as bool": (
        fn("  %0 = constant() {value = dense<bool[1] [§1]>} : bool[1]"),
        "expected an element of bool, found '1'",
    ),
    "bool as float": (
        fn("  %0 = constant() {value = dense<f32[1] splat §true>} : f32[1]"),
        "expected an element of f32, found 'true'",
    ),
    "no dense data": (
        fn("  %0 = constant() {value = dense<f32[1] §ones>} : f32[1]"),
        "expected splat, [values], file or 0x hex data, found 'ones'",
    ),
    "file without resource dir": (
        fn('  %0 = constant() {value = dense<f32[2] §file "a.bin">} : f32[2]'),
        "constant refers to file 'a.bin'; pass resource_dir",
    ),
    "result count": (fn("  §%0, %1 = exp(%x) : f32[4]"), "names 2 results but lists 1 types"),
    "result name": (fn("  %0, §1 = exp(%x) : f32[4]"), "expected a result name"),
    "no operand": (fn("  %0 = exp(§1) : f32[4]"), "expected a value (%name)"),
    "unclosed body": ("func @f(%x: f32[4]) -> (f32[4]) {\n  return(%x)§\n", "missing '}'"),
    "unclosed module": ("module {\n" + fn("  return(%x)")[:-1] + "§\n", "expected '}' to close"),
    "trailing input": (fn("  return(%x)") + "§garbage\n", "expected 'func' or end of input"),
    "loc line": (fn('  return(%x) loc("a.py":§x:2)'), "expected a line number (an integer)"),
    "loc file": (fn("  return(%x) loc(§a:1:2)"), "expected a file name, found 'a'"),
    "function name": ("func §f(%x: f32[4]) -> () {\n}\n", "expected a function name (@name)"),
    "no arrow": ("func @f(%x: f32[4]) §(f32[4]) {\n}\n", "expected '->'"),
    "argument name": ("func @f(§x: f32[4]) -> () {\n}\n", "expected an argument name (%name)"),
}


@pytest.mark.parametrize("case", sorted(PARSE_ERRORS))
def test_malformed_ir_is_a_located_parse_error(case: str) -> None:
    marked, message = PARSE_ERRORS[case]
    source, line, col = located(marked)
    with pytest.raises(ParseError) as info:
        parse_module(source, FILE)
    check_rendering(info.value, source, line, col, message)


def test_resource_file_errors(tmp_path) -> None:
    text = fn('  %0 = constant() {value = dense<f32[2] §file "a.bin">} : f32[2]\n  return(%0)')
    source, line, col = located(text)
    with pytest.raises(ParseError) as info:
        parse_module(source, FILE, resource_dir=tmp_path)
    check_rendering(info.value, source, line, col, "not found")
    (tmp_path / "a.bin").write_bytes(b"\0" * 7)
    with pytest.raises(ParseError) as info:
        parse_module(source, FILE, resource_dir=tmp_path)
    check_rendering(info.value, source, line, col, "is truncated")
    (tmp_path / "a.bin").write_bytes(b"\0" * 4)
    with pytest.raises(ParseError, match="holds 1 elements"):
        parse_module(source, FILE, resource_dir=tmp_path)
    escape = source.replace('"a.bin"', '"../a.bin"')
    with pytest.raises(ParseError, match="not found"):
        parse_module(escape, FILE, resource_dir=tmp_path)


VERIFY_ERRORS = {
    "operand count": (
        fn("  %0 = §add(%x) : f32[4]\n  return(%0)"),
        "'add' takes 2 operands, got 1",
    ),
    "missing attribute": (
        fn("  %0 = §transpose(%x) : f32[4]\n  return(%0)"),
        "'transpose' is missing attribute(s) perm",
    ),
    "broadcasting": (
        fn("  %0 = §add(%x, %y) : f32[4]\n  return(%0)", "%x: f32[4], %y: f32[3]"),
        "add: shapes [4] and [3] do not broadcast",
    ),
    "dtype mismatch": (
        fn("  %0 = §mul(%x, %y) : f32[4]\n  return(%0)", "%x: f32[4], %y: i32[4]"),
        "mul: operands must share one dtype, got f32[4], i32[4]; insert a cast",
    ),
    "float op on ints": (
        fn("  %0 = §exp(%x) : i32[4]\n  return(%0)", "%x: i32[4]", "i32[4]"),
        "exp: needs a floating-point operand, got i32[4]",
    ),
    "result type": (
        fn("  %0 = §exp(%x) : f32[5]\n  return(%0)", results="f32[5]"),
        "'exp' result type f32[5] does not match the inferred f32[4]",
    ),
    "contraction": (
        fn("  %0 = §matmul(%x, %x) : f32[4,4]\n  return(%0)", "%x: f32[4,3]", "f32[4,4]"),
        "matmul: contraction dims differ",
    ),
    "axis range": (
        fn("  %0 = §softmax(%x) {axis = 1} : f32[4]\n  return(%0)"),
        "softmax: axis 1 is out of range for rank 1",
    ),
    "missing terminator": (fn("  %0 = §exp(%x) : f32[4]"), "block must end with 'return'"),
    "empty body": ("§func @f() -> () {\n}\n", "block must end with 'return'"),
    "yield in a function": (fn("  §yield(%x)"), "block must end with 'return'"),
    "terminator not last": (
        fn("  §return(%x)\n  return(%x)"),
        "'return' must be the last op of its block",
    ),
    "return types": (
        fn("  §return(%x)", results="f32[3]"),
        "returns (f32[4]) but declares (f32[3])",
    ),
    "return count": (fn("  §return(%x, %x)"), "returns (f32[4], f32[4]) but declares (f32[4])"),
    "unbound symbol": (
        fn(
            "  %0 = §broadcast_to(%x) {shape = [?n, 4]} : f32[?n,4]\n  return(%0)",
            results="f32[?n,4]",
        ),
        "uses ?n, which no argument type defines",
    ),
    "unbound symbol in an attribute": (
        fn(
            "  %0 = §reshape(%x) {shape = [?n, 4]} : f32[1,4]\n  return(%0)",
            "%x: f32[4]",
            "f32[1,4]",
        ),
        "attribute 'shape' uses ?n, which no argument type defines",
    ),
    "regions": (
        fn("  %0 = §exp(%x) : f32[4] region () {\n    yield()\n  }\n  return(%0)"),
        "'exp' needs 0 region(s)",
    ),
    "symbolic slice": (
        fn(
            "  %0 = §slice(%x) {starts = [1], stops = [3], steps = [1]} : f32[2]\n  return(%0)",
            "%x: f32[?n]",
            "f32[2]",
        ),
        "slice: symbolic dim ?n of f32[?n] can only be kept whole or reversed",
    ),
    "reshape count": (
        fn("  %0 = §reshape(%x) {shape = [3]} : f32[3]\n  return(%0)", results="f32[3]"),
        "reshape: cannot reshape [4] to [3]: element counts differ",
    ),
}


@pytest.mark.parametrize("case", sorted(VERIFY_ERRORS))
def test_broken_rules_are_located_verification_errors(case: str) -> None:
    marked, message = VERIFY_ERRORS[case]
    source, line, col = located(marked)
    module = parse_module(source, FILE)
    with pytest.raises(VerificationError) as info:
        verify(module)
    check_rendering(info.value, source, line, col, message)


def built(*ops_of) -> Module:
    """A module whose @main has argument %x: f32[4] and the ops `ops_of(x)` returns, unverified."""
    x = Value(TensorType.of("f32", (4,)), "x", None, 0)
    fn_ = Function("main", [x], [TensorType.of("f32", (4,))])
    for op in ops_of[0](x):
        fn_.body.append(op)
    return Module(functions=[fn_])


def op(name: str, operands, result: str | None = "y") -> Operation:
    types = [TensorType.of("f32", (4,))] if result else []
    return Operation(OPS[name], operands, {}, types, [result] if result else [])


def test_graphs_built_by_hand_are_checked_too() -> None:
    def duplicate(x):
        a = op("exp", [x], "y")
        b = op("exp", [x], "y")
        return [a, b, op("return", [b.result], None)]

    def cycle(x):
        later = op("exp", [x], "z")
        first = op("exp", [later.result], "y")
        return [first, later, op("return", [first.result], None)]

    def bad_name(x):
        a = op("exp", [x], "a b")
        return [a, op("return", [a.result], None)]

    def bad_attribute(x):
        a = op("softmax", [x])
        a.attrs["axis"] = "last"
        return [a, op("return", [a.result], None)]

    def unknown_attribute(x):
        a = op("exp", [x])
        a.attrs["fast"] = True
        return [a, op("return", [a.result], None)]

    for make, message in [
        (duplicate, "value %y is defined twice"),
        (cycle, "'exp' uses %z before it is defined"),
        (bad_name, "value name %a b is not a valid name"),
        (bad_attribute, "'softmax' attribute 'axis': expected an integer, got 'last'"),
        (unknown_attribute, "'exp' has no attribute\\(s\\) fast"),
    ]:
        with pytest.raises(VerificationError, match=message) as info:
            verify(built(make))
        assert "\n  in: " in str(info.value)  # no text to point at: the op is quoted instead


def test_a_value_from_another_function_is_not_visible() -> None:
    other = Value(TensorType.of("f32", (4,)), "w", None, 0)
    with pytest.raises(VerificationError, match="uses %w before it is defined"):
        verify(built(lambda x: [op("exp", [other]), op("return", [x], None)]))


def test_builder_misuse_raises_tilefold_errors() -> None:
    b = Builder()
    x = b.arg("x", "f32", (4, 3))
    cases = [
        (UnsupportedError, "unknown op 'bogus'", lambda: b.op("bogus", x)),
        (VerificationError, "'add' takes 2 operands, got 1", lambda: b.op("add", x)),
        (VerificationError, "missing attribute", lambda: b.op("reshape", x)),
        (VerificationError, "no attribute(s) bogus", lambda: b.op("exp", x, bogus=1)),
        (VerificationError, "expected a list of integers", lambda: b.op("transpose", x, perm=1)),
        (VerificationError, "expected one of none, tanh", lambda: b.op("gelu", x, approximate="x")),
        (ShapeError, "do not broadcast", lambda: x + b.arg("y", "f32", (5,))),
        (VerificationError, "already defined", lambda: b.arg("x", "f32", ())),
        (VerificationError, "not valid", lambda: b.arg("a b", "f32", ())),
        (VerificationError, "not valid", lambda: Builder("no spaces")),
        (ShapeError, "not an identifier", lambda: b.arg("z", "f32", ("bad name",))),
        (ShapeError, "bad dimension -1", lambda: b.arg("w", "f32", (-1,))),
        (DTypeError, "unknown dtype", lambda: b.arg("v", "f33", ())),
        (DTypeError, "does not fit in i8", lambda: b.constant(300, "i8")),
        (ShapeError, "index 4 is out of range for axis 0", lambda: x[4]),
        (ShapeError, "too many indices", lambda: x[0, 0, 0]),
        (ShapeError, "only one '...'", lambda: x[..., ...]),
        (UnsupportedError, "use gather", lambda: x[[0, 1]]),
        (UnsupportedError, "not supported", lambda: x[True]),
        (UnsupportedError, "truth value", lambda: bool(x > 0)),
        (UnsupportedError, "static first axis", lambda: list(b.arg("s", "f32", ("n",)))),
    ]
    for kind, message, call in cases:
        with pytest.raises(kind, match=message.replace("(", r"\(").replace(")", r"\)")):
            call()
    other = Builder("other").arg("o", "f32", (4, 3))
    with pytest.raises(VerificationError, match="another builder"):
        x + other
    b.build(x)
    with pytest.raises(VerificationError, match="already built"):
        b.op("exp", x)


def test_interpreter_input_mismatch() -> None:
    b = Builder()
    x = b.arg("x", "f32", ("n", 3))
    b.arg("y", "f32", ("n",))
    module = b.build(x)
    ok = np.zeros((2, 3), np.float32)
    cases = [
        (ShapeError, "takes 2 inputs, got 1", (ok,)),
        (
            DTypeError,
            "expects f32\\[\\?n,3\\], got an array of float64",
            (ok.astype(float), ok[:, 0]),
        ),
        (DTypeError, "got an array of int16", (ok.astype(np.int16), ok[:, 0])),
        (ShapeError, "got shape \\[2\\]", (ok[:, 0], ok[:, 0])),
        (ShapeError, "got shape \\[2, 4\\]", (np.zeros((2, 4), np.float32), ok[:, 0])),
        (ShapeError, "\\?n is 2 elsewhere but 3 here", (ok, np.zeros(3, np.float32))),
    ]
    for kind, message, inputs in cases:
        with pytest.raises(kind, match=message):
            interpret(module, *inputs)
    with pytest.raises(TilefoldError, match="no function @nope"):
        interpret(module, ok, ok[:, 0], function="nope")
