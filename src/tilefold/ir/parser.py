"""Parses the textual IR (see printer.py for the grammar by example) into a Module.

Errors are `ParseError`s pointing at the line and column, with the offending line and a caret.
`//` starts a comment, so lit test files parse as they are.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tilefold import dtypes
from tilefold.errors import Location, ParseError, ShapeError, TilefoldError
from tilefold.ir.core import NAME, Block, Function, Module, Operation, Value
from tilefold.ir.limits import ADDRESS_LIMIT, size_problem
from tilefold.ir.opdef import OPS, Attr, OpDef
from tilefold.ir.ops.common import int_range
from tilefold.ir.printer import decode_scalars
from tilefold.ir.types import (
    PARTIAL_REDUCTIONS,
    Dim,
    Mesh,
    Partial,
    Placement,
    Replicate,
    Shard,
    Sharding,
    SymDim,
    TensorType,
    dim,
)

T = TypeVar("T")

_TOKEN = re.compile(
    rf"""
    (?P<space>[ \t\r]+|//[^\n]*)
  | (?P<newline>\n)
  | (?P<value>%{NAME.pattern})
  | (?P<symbol>@{NAME.pattern})
  | (?P<sym>\?[A-Za-z_][A-Za-z0-9_]*|\?\([A-Za-z0-9_+*-]+\))
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<hex>0x[0-9A-Fa-f]*)
  | (?P<number>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|inf\b|nan\b))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>->|[(){{}}\[\]<>,:=])
    """,
    re.VERBOSE,
)


@dataclass
class Token:
    kind: str
    text: str
    line: int
    col: int


def tokenize(text: str, file: str) -> list[Token]:
    tokens, line, start, pos = [], 1, 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            loc = Location(file, line, pos - start + 1)
            what = (
                "unterminated string" if text[pos] == '"' else f"unexpected character {text[pos]!r}"
            )
            raise ParseError(what, loc, text)
        kind = m.lastgroup
        if kind == "newline":
            line, start = line + 1, m.end()
        elif kind != "space":
            tokens.append(Token(kind, m.group(), line, pos - start + 1))
        pos = m.end()
    # End of input is reported just after the last token (where a missing '}' belongs).
    last = tokens[-1] if tokens else Token("eof", "", 1, 1)
    tokens.append(Token("eof", "", last.line, last.col + len(last.text)))
    return tokens


class Parser:
    """A recursive-descent parser over the token list, one method per grammar rule."""

    def __init__(self, text: str, file: str, resource_dir: Path | None,
                 bound: dict[str, np.ndarray] | None = None):
        self.text = text
        self.file = file
        self.resource_dir = resource_dir
        self.bound = bound or {}
        self.tokens = tokenize(text, file)
        self.pos = 0
        self.scope: dict[str, Value] = {}
        self.meshes: dict[str, Mesh] = {}

    # -- token helpers -----------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def loc(self, tok: Token | None = None) -> Location:
        tok = tok or self.tok
        return Location(self.file, tok.line, tok.col)

    def error(self, message: str, tok: Token | None = None) -> ParseError:
        return ParseError(message, self.loc(tok), self.text)

    def next(self) -> Token:
        tok = self.tok
        self.pos += 1
        return tok

    def at(self, text: str) -> bool:
        return self.tok.text == text and self.tok.kind in ("punct", "ident")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.pos += 1
            return True
        return False

    def expect(self, text: str, what: str = "") -> Token:
        if not self.at(text):
            found = self.tok.text or "end of input"
            raise self.error(f"expected '{text}'{' ' + what if what else ''}, found '{found}'")
        return self.next()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what}, found '{self.tok.text or 'end of input'}'")
        return self.next()

    def integer(self, what: str) -> int:
        tok = self.next()
        if tok.kind != "number" or not re.fullmatch(r"-?\d+", tok.text):
            raise self.error(
                f"expected {what} (an integer), found '{tok.text or 'end of input'}'", tok
            )
        return int(tok.text)

    def string(self, what: str) -> str:
        tok = self.expect_kind("string", what)
        try:
            return json.loads(tok.text)
        except ValueError:
            raise self.error(f"malformed string {tok.text}: use JSON escapes", tok) from None

    def comma_list(self, close: str, item: Callable[[], T]) -> list[T]:
        items = []
        if not self.accept(close):
            items.append(item())
            while self.accept(","):
                items.append(item())
            self.expect(close)
        return items

    # -- types -------------------------------------------------------------------------------

    def dtype(self) -> dtypes.DType:
        tok = self.expect_kind("ident", "a dtype")
        try:
            return dtypes.dtype(tok.text)
        except Exception:
            raise self.error(f"unknown dtype '{tok.text}'", tok) from None

    def sym_dim(self, tok) -> SymDim:
        """`?name` or `?(sum)`."""
        try:
            return dim(tok.text)  # type: ignore[return-value]
        except ShapeError as exc:
            raise self.error(exc.message, tok) from None

    def dim(self) -> Dim:
        if self.tok.kind == "sym":
            return self.sym_dim(self.next())
        tok = self.tok
        size = self.integer("a dimension")
        if size < 0:
            raise self.error(f"tensor dimensions cannot be negative (got {size})", tok)
        if size > ADDRESS_LIMIT:
            raise self.error(f"tensor dimension {size} is above 2**63-1: no buffer is that big",
                             tok)
        return size

    def type(self) -> TensorType:
        start = self.tok
        dt = self.dtype()
        self.expect("[", "after the dtype of a tensor type")
        shape = self.comma_list("]", self.dim)
        static = [d for d in shape if isinstance(d, int)]
        why = size_problem(static, dt, ADDRESS_LIMIT)
        if why is not None:
            shown = f"{dt}[{','.join(map(str, shape))}]"
            raise self.error(f"tensor type {shown} is too large: {why}", start)
        strides = None
        if self.at("{"):
            brace = self.next()
            strides = self.comma_list("}", lambda: self.integer("a stride"))
            if len(strides) != len(shape):
                raise self.error(
                    f"{len(strides)} strides given for a rank-{len(shape)} type", brace
                )
        sharding = self.sharding() if self.tok.kind == "symbol" else None
        return TensorType(tuple(shape), dt, None if strides is None else tuple(strides), sharding)

    def sharding(self) -> Sharding:
        """`@m[S(0),R]`: a declared mesh and its placements (checked against the shape by the
        verifier, which names the value)."""
        tok = self.next()
        mesh = self.meshes.get(tok.text[1:])
        if mesh is None:
            known = ", ".join(f"@{m}" for m in self.meshes) or "none"
            raise self.error(
                f"unknown mesh {tok.text} (declared: {known}); declare it first with "
                f"'mesh {tok.text} [axis=size, ...]'", tok)
        self.expect("[", "after the mesh of a sharded type")
        return Sharding(mesh, tuple(self.comma_list("]", self.placement)))

    def placement(self) -> Placement:
        tok = self.expect_kind("ident", "a placement (R, S(dim), S(dim,pad), P(sum) or P(max))")
        if tok.text == "R":
            return Replicate()
        if tok.text == "S":
            self.expect("(", "after S")
            d = self.integer("the sharded dim")
            pad = self.accept(",")
            if pad:
                word = self.expect_kind("ident", "pad (S(dim,pad) pads uneven blocks)")
                if word.text != "pad":
                    raise self.error(f"'S({d},{word.text})': the only option of a shard is "
                                     f"pad, as in S({d},pad)", word)
            self.expect(")")
            return Shard(d, pad)
        if tok.text == "P":
            self.expect("(", "after P")
            op = self.expect_kind("ident", "sum or max")
            if op.text not in PARTIAL_REDUCTIONS:
                raise self.error(f"partial reduction '{op.text}': use sum or max", op)
            self.expect(")")
            return Partial(op.text)
        raise self.error(f"unknown placement '{tok.text}': use R, S(dim), S(dim,pad), P(sum) or "
                         "P(max)", tok)

    def mesh(self) -> Mesh:
        """`mesh @m [dp=2, tp=4]`."""
        self.expect("mesh")
        tok = self.expect_kind("symbol", "a mesh name (@name)")
        if tok.text[1:] in self.meshes:
            raise self.error(f"redefinition of mesh {tok.text}", tok)
        self.expect("[", "after the mesh name")

        def axis() -> tuple[str, int]:
            name = self.expect_kind("ident", "a mesh axis name").text
            self.expect("=", "after a mesh axis name")
            return name, self.integer("the axis size")

        axes = self.comma_list("]", axis)
        try:
            mesh = Mesh(tok.text[1:], tuple(axes))
        except TilefoldError as exc:
            raise self.error(exc.message, tok) from None
        self.meshes[mesh.name] = mesh
        return mesh

    def result_types(self) -> list[TensorType]:
        if self.accept("("):
            return self.comma_list(")", self.type)
        return [self.type()]

    # -- attributes --------------------------------------------------------------------------

    def literal(self) -> Any:
        """An attribute value as Python data; the attribute's `Attr.normalize` checks its kind."""
        if self.tok.kind == "string":
            return self.string("a string")
        tok = self.next()
        if tok.kind == "number":
            text = tok.text
            return float(text) if re.search(r"[.eEn]", text) else int(text)
        if tok.kind == "ident" and tok.text in ("true", "false"):
            return tok.text == "true"
        if tok.kind == "sym":
            return self.sym_dim(tok)
        if tok.kind == "ident" and tok.text == "dense":
            return self.dense(tok)
        if tok.kind == "ident":
            return tok.text
        if tok.text == "[":
            return self.comma_list("]", self.literal)
        raise self.error(f"expected an attribute value, found '{tok.text}'", tok)

    def dense(self, start: Token) -> np.ndarray:
        self.expect("<")
        t = self.type()
        dt = t.dtype
        if not t.is_static:
            raise self.error("a dense constant needs a static shape", start)
        count = t.num_elements
        why = size_problem(t.shape, dt)  # type: ignore[arg-type]
        if why is not None:
            raise self.error(f"dense constant of type {t} is too large: {why}", start)
        tok = self.tok
        if self.accept("splat"):
            flat = decode_scalars([self.scalar_text(dt)], dt).repeat(count)
        elif self.accept("["):
            flat = decode_scalars(self.comma_list("]", lambda: self.scalar_text(dt)), dt)
        elif self.accept("file"):
            name = self.string("a resource file name")
            if name in self.bound:
                self.expect(">")
                return self.bound_constant(name, t, tok)
            flat = self.resource(name, tok, t)
        else:
            raw = self.expect_kind("hex", "splat, [values], file or 0x hex data").text[2:]
            try:
                flat = np.frombuffer(bytes.fromhex(raw), dtype=dt.np_dtype)
            except ValueError:
                raise self.error("malformed hex data in a dense constant", tok) from None
        self.expect(">")
        if flat.size != count:
            raise self.error(f"dense constant of type {t} holds {flat.size} elements", tok)
        return flat.reshape(t.shape).copy()

    def scalar_text(self, dt: dtypes.DType) -> str:
        """One element's text, checked to denote a value of `dt`."""
        tok = self.next()
        if dt.kind == "bool":
            ok = tok.text in ("true", "false")
        elif dt.is_integer:
            lo, hi = int_range(dt)
            ok = bool(re.fullmatch(r"-?\d+", tok.text)) and lo <= int(tok.text) <= hi
        else:
            ok = tok.kind == "number"
        if not ok:
            raise self.error(
                f"expected an element of {dt}, found '{tok.text or 'end of input'}'", tok
            )
        return tok.text

    def bound_constant(self, name: str, t: TensorType, tok: Token) -> np.ndarray:
        """The caller's array for `name` (a weight): shared, not copied, and read-only here."""
        array = self.bound[name]
        if array.dtype != t.dtype.np_dtype:
            raise self.error(f"bound array {name!r} is {array.dtype}, the constant {t.dtype}", tok)
        if array.size != t.num_elements:
            raise self.error(f"dense constant of type {t} holds {array.size} elements", tok)
        view = np.ascontiguousarray(array).reshape(t.shape)
        view.flags.writeable = False
        return view

    def resource(self, name: str, tok: Token, t: TensorType) -> np.ndarray:
        """The constant's elements from its side file, whose size is checked before reading."""
        if self.resource_dir is None:
            raise self.error(f"constant refers to file {name!r}; pass resource_dir", tok)
        path = self.resource_dir / name
        if "/" in name or ".." in name or not path.is_file():
            raise self.error(f"resource file {str(path)!r} not found", tok)
        size, itemsize = path.stat().st_size, t.dtype.itemsize
        if size % itemsize:
            raise self.error(f"resource file {str(path)!r} is truncated", tok)
        if size // itemsize != t.num_elements:
            raise self.error(f"dense constant of type {t} holds {size // itemsize} elements", tok)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise self.error(f"cannot read resource file {str(path)!r}: {exc.strerror}",
                             tok) from None
        return np.frombuffer(raw, dtype=t.dtype.np_dtype)

    def attr_dict(self, opdef: type[OpDef]) -> dict:
        attrs: dict = {}
        if not self.at("{"):
            return attrs
        self.next()
        while not self.accept("}"):
            key_tok = self.expect_kind("ident", "an attribute name")
            spec: Attr | None = opdef.attributes.get(key_tok.text)
            if spec is None:
                known = ", ".join(opdef.attributes) or "none"
                raise self.error(
                    f"'{opdef.name}' has no attribute '{key_tok.text}' (it has: {known})", key_tok
                )
            if key_tok.text in attrs:
                raise self.error(f"attribute '{key_tok.text}' given twice", key_tok)
            self.expect("=")
            value_tok = self.tok
            value = self.literal()
            try:
                attrs[key_tok.text] = spec.normalize(value)
            except TypeError as exc:
                raise self.error(f"attribute '{key_tok.text}': {exc}", value_tok) from None
            if not self.at("}"):
                self.expect(",", "between attributes")
        return attrs

    # -- structure ---------------------------------------------------------------------------

    def define(self, tok: Token, type: TensorType) -> Value:
        name = tok.text[1:]
        if name in self.scope:
            raise self.error(f"redefinition of value %{name}", tok)
        value = Value(type, name, None, 0)
        self.scope[name] = value
        return value

    def use(self) -> Value:
        tok = self.expect_kind("value", "a value (%name)")
        value = self.scope.get(tok.text[1:])
        if value is None:
            raise self.error(f"use of undefined value {tok.text}", tok)
        return value

    def typed_arg(self) -> tuple[Token, TensorType]:
        tok = self.expect_kind("value", "an argument name (%name)")
        self.expect(":")
        return tok, self.type()

    def location(self) -> Location | None:
        if not self.accept("loc"):
            return None
        self.expect("(")
        file = self.string("a file name")
        self.expect(":")
        line = self.integer("a line number")
        self.expect(":")
        col = self.integer("a column number")
        self.expect(")")
        return Location(file, line, col)

    def operation(self) -> Operation:
        start = self.tok
        result_toks = []
        if self.tok.kind == "value":
            result_toks.append(self.next())
            while self.accept(","):
                result_toks.append(self.expect_kind("value", "a result name"))
            self.expect("=")
        name_tok = self.expect_kind("ident", "an op name")
        opdef = OPS.get(name_tok.text)
        if opdef is None:
            raise self.error(f"unknown op '{name_tok.text}'", name_tok)
        self.expect("(", f"after op name '{name_tok.text}'")
        operands = self.comma_list(")", self.use)
        attrs = self.attr_dict(opdef)
        types = self.result_types() if self.accept(":") else []
        if len(types) != len(result_toks):
            raise self.error(
                f"'{opdef.name}' names {len(result_toks)} results but lists {len(types)} types",
                start,
            )
        regions = []
        while self.accept("region"):
            self.expect("(")
            args = self.comma_list(")", self.typed_arg)
            block = Block([self.define(tok, t) for tok, t in args])
            self.body(block)
            regions.append(block)
        op = Operation(opdef, operands, attrs, types, [t.text[1:] for t in result_toks], regions)
        for tok, result in zip(result_toks, op.results, strict=True):
            if tok.text[1:] in self.scope:
                raise self.error(f"redefinition of value {tok.text}", tok)
            self.scope[result.name] = result
        op.loc = self.location()
        op.text_loc = self.loc(name_tok)
        return op

    def body(self, block: Block) -> None:
        self.expect("{")
        while not self.accept("}"):
            if self.tok.kind == "eof":
                raise self.error("unexpected end of input: missing '}'")
            block.append(self.operation())

    def function(self) -> Function:
        start = self.expect("func")
        name = self.expect_kind("symbol", "a function name (@name)").text[1:]
        self.scope = {}
        self.expect("(")
        args = self.comma_list(")", self.typed_arg)
        self.expect("->")
        self.expect("(")
        results = self.comma_list(")", self.type)
        fn = Function(name, [self.define(tok, t) for tok, t in args], results)
        fn.loc = self.location()
        fn.text_loc = self.loc(start)
        self.body(fn.body)
        return fn

    def module(self) -> Module:
        module = Module()
        braced = self.accept("module")
        if braced:
            if self.tok.kind == "symbol":
                module.name = self.next().text[1:]
            self.expect("{")
        while self.at("mesh"):
            self.mesh()
        module.meshes = dict(self.meshes)
        while self.at("func"):
            tok = self.tok
            fn = self.function()
            if fn.name in module.functions:
                raise self.error(f"redefinition of function @{fn.name}", tok)
            module.add(fn)
        if braced:
            self.expect("}", "to close the module")
        if self.tok.kind != "eof":
            raise self.error(f"expected 'func' or end of input, found '{self.tok.text}'"
                             + (" (meshes are declared before the functions)"
                                if self.at("mesh") else ""))
        module.source_text, module.source_name = self.text, self.file
        return module


def parse_module(
    text: str, file: str = "<string>", resource_dir: str | Path | None = None,
    bound: dict[str, np.ndarray] | None = None,
) -> Module:
    """Parse IR text. `resource_dir` is where `dense<... file "x.bin">` constants live;
    `bound` supplies such constants by name instead (the printer's `external`)."""
    resources = Path(resource_dir) if resource_dir is not None else None
    with collector_paused():
        return Parser(text, file, resources, bound).module()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block: for code that builds many
    objects that all live on (a module's ops and values), where each collection the
    allocations trigger finds nothing to free but walks every object of the process (in a
    process holding PyTorch and a model, it had doubled a graph's parse: 0.3 s of 0.6)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def parse_file(path: str | Path, resource_dir: str | Path | None = None) -> Module:
    path = Path(path)
    return parse_module(read_source(path), str(path), resource_dir)


def read_source(path: str | Path) -> str:
    """The text of an IR file, or a ParseError saying why it has none: missing, a directory,
    unreadable, not UTF-8, binary or empty."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise ParseError(f"cannot read {path}: it is a directory, not an IR file") from None
    except OSError as exc:
        raise ParseError(f"cannot read {path}: {exc.strerror}") from None
    return decode_source(data, str(path))


_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029]")


def decode_source(data: bytes, file: str) -> str:
    """`data` as IR text: UTF-8, no NUL characters (a sign of a binary file), not blank."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        at = exc.start
        what = (f"byte 0x{data[at]:02x} is not UTF-8: IR files are UTF-8 text (is this a binary "
                "file, or one saved in another encoding?)")
        if exc.end == len(data) and "end of data" in exc.reason:
            what = "the file ends inside a UTF-8 character: is it truncated?"
        raise _located(what, file,
                      data[:at].decode(), data[at:].decode(errors="replace")) from None
    at = text.find("\0")
    if at >= 0:
        what = "a NUL character: IR files are text, and this looks like a binary file"
        raise _located(what, file, text[:at], text[at:])
    if not text.strip():
        raise ParseError(f"{file} is empty: expected IR text, e.g. "
                         "'func @main(%x: f32[4]) -> (f32[4]) { return(%x) }'")
    return text


def _located(what: str, file: str, before: str, after: str) -> ParseError:
    """An error where `after` starts, quoting that line (cut short and made printable)."""
    line = before.count("\n") + 1
    head = before[before.rfind("\n") + 1 :]
    shown = _UNPRINTABLE.sub("\ufffd", (head + after.split("\n", 1)[0])[: len(head) + 40])
    return ParseError(what, Location(file, line, len(head) + 1), "\n" * (line - 1) + shown)
