"""The textual IR: prints a module so that `parse(print(m))` prints back identically.

The grammar by example (`//` starts a comment, which the parser skips):

    module @example {
      func @main(%x: f32[?b,4]{4,1}, %w: f32[4,4]) -> (f32[?b,4], bf16[4]) loc("m.py":1:1) {
        %0 = matmul(%x, %w) {transpose_b = true} : f32[?b,4] loc("m.py":3:8)
        %1 = gelu(%0) {approximate = "tanh"} : f32[?b,4]
        %c = constant() {value = dense<bf16[4] [0.5, -0.0, inf, nan]>} : bf16[4]
        return(%1, %c)
      }
    }

- Types: `dtype[dims]`, a dim an int or a symbol `?name`, then optional strides in elements.
- Attributes: in declaration order, defaults left out; ints, floats (`1e-05`, `inf`, `nan`),
  `true`/`false`, JSON strings, lists (`[1, ?b]`), dtype names (`bf16`) and dense constants.
- Dense constants: `[decimals]` (up to 16 elements, each reading back bit for bit), `splat x`,
  raw little-endian bytes `0x...` (NaN payloads, bigger data), or `file "name.bin"`: a side file
  in the resource dir given to `print_module`/`parse_module`, or an array the caller binds by
  name (`external` when printing, `bound` when parsing: weights kept out of the text).
- Ops with regions: `%y = fused(%a) : T region (%r: T) {` ... `yield(%v)` ... `}`.
- Device meshes: `mesh @m [dp=2, tp=4]` lines open the module; a type placed on one follows its
  shape (and strides) with one placement per mesh axis, `f32[8,16] @m[S(0),R]`: `R` replicated,
  `S(d)` dim d split in equal blocks, `S(d,pad)` split in blocks of ceil(size/n) rows, the last
  ones padded, `P(sum)`/`P(max)` partial values still to be reduced.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import Location
from tilefold.ir.core import Block, Function, Module, Operation, Value
from tilefold.ir.opdef import Attr
from tilefold.ir.ops.common import round_to
from tilefold.ir.types import TensorType

INDENT = "  "
DECIMAL_LIMIT = 16  # constants with at most this many finite elements print as decimals
FILE_LIMIT = 4096  # with a resource dir, constants above this many bytes go to side files


def format_float(value: float) -> str:
    if math.isnan(value):  # the sign is kept: FPUs differ in the sign of the NaNs they make
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(float(value))


def format_scalar(value: Any, dt: dtypes.DType) -> str:
    """A decimal that reads back to the same element of dtype `dt`: the exact value when it is
    short (`448.0`), else the shortest that rounds back (`0.1` for bf16's 0.10009765625).

    Floats always show a `.` or an exponent; a NaN keeps its sign (`-nan`) but not its payload
    (`Printer._exact` checks, and hex bytes keep what decimals cannot).
    """
    if dt.kind == "bool":
        return "true" if value else "false"
    if dt.is_integer:
        return str(int(value))
    wide = float(value)  # exact: every tilefold float fits in f64
    exact = format_float(wide)
    if len(exact) <= 8 or not math.isfinite(wide):
        return exact
    target = np.asarray(value, dt.np_dtype).tobytes()
    for digits in range(1, 17):
        text = f"{wide:.{digits}g}"
        if decode_scalars([text], dt).tobytes() == target:
            return text if re.search(r"[.e]", text) else text + ".0"
    return exact


def decode_scalars(texts: list[str], dt: dtypes.DType) -> np.ndarray:
    """Inverse of `format_scalar` for a flat list of element texts (rounding once)."""
    if dt.kind == "bool":
        return np.array([t == "true" for t in texts], dtype=np.bool_)
    if dt.is_integer:
        return np.array([int(t) for t in texts], dtype=np.int64).astype(dt.np_dtype)
    return round_to(np.array([float(t) for t in texts], dtype=np.float64), dt)


class Printer:
    """Accumulates text; `resource_dir` (optional) receives large constants as side files;
    constants whose array is in `external` (by identity) print as that name's `file` ref."""

    def __init__(self, resource_dir: str | Path | None = None, file_limit: int = FILE_LIMIT,
                 external: dict[int, str] | None = None):
        self.lines: list[str] = []
        self.resource_dir = Path(resource_dir) if resource_dir is not None else None
        self.file_limit = file_limit
        self.external = external or {}

    # -- attributes --------------------------------------------------------------------------

    def dense(self, value: np.ndarray) -> str:
        dt = dtypes.dtype(value.dtype)
        head = str(TensorType.of(dt, value.shape))
        if id(value) in self.external:
            return f"dense<{head} file {json.dumps(self.external[id(value)])}>"
        flat = np.ascontiguousarray(value).reshape(-1)
        raw = flat.tobytes()
        if self.resource_dir is not None and len(raw) > self.file_limit:
            name = hashlib.sha256(head.encode() + raw).hexdigest()[:16] + ".bin"
            self.resource_dir.mkdir(parents=True, exist_ok=True)
            path = self.resource_dir / name
            if not path.exists():
                path.write_bytes(raw)
            return f'dense<{head} file "{name}">'
        if flat.size > 1:
            rows = np.frombuffer(raw, np.uint8).reshape(flat.size, -1)
            text = format_scalar(flat[0], dt)
            if (rows == rows[0]).all() and self._exact([text], flat[:1], dt):
                return f"dense<{head} splat {text}>"
        if flat.size <= DECIMAL_LIMIT:
            texts = [format_scalar(v, dt) for v in flat]
            if self._exact(texts, flat, dt):
                return f"dense<{head} [{', '.join(texts)}]>"
        return f"dense<{head} 0x{raw.hex().upper()}>"

    @staticmethod
    def _exact(texts: list[str], flat: np.ndarray, dt: dtypes.DType) -> bool:
        """Whether the decimal texts read back bit-exactly (-0.0, inf and -nan do; NaN payloads
        other than the default quiet one do not)."""
        return decode_scalars(texts, dt).tobytes() == flat.tobytes()

    def attr(self, spec: Attr, value: Any) -> str:
        if spec.kind == "bool":
            return "true" if value else "false"
        if spec.kind == "int":
            return str(value)
        if spec.kind == "float":
            return format_float(value)
        if spec.kind == "str":
            return json.dumps(value)
        if spec.kind in ("ints", "shape"):
            return "[" + ", ".join(str(v) for v in value) + "]"
        if spec.kind == "dtype":
            return str(value)
        return self.dense(value)

    def attr_dict(self, op: Operation) -> str:
        """`{k = v, ...}` in declaration order; a value that prints as its default is left out."""
        items = []
        for key, spec in op.opdef.attributes.items():
            value = op.attrs.get(key)
            if value is None:
                continue
            text = self.attr(spec, value)
            if spec.default is None or spec.required or text != self.attr(spec, spec.default):
                items.append(f"{key} = {text}")
        return " {" + ", ".join(items) + "}" if items else ""

    # -- structure ---------------------------------------------------------------------------

    @staticmethod
    def loc(loc: Location | None) -> str:
        return f" loc({json.dumps(loc.file)}:{loc.line}:{loc.col})" if loc else ""

    @staticmethod
    def args(values: list[Value]) -> str:
        return ", ".join(f"%{v.name}: {v.type}" for v in values)

    @staticmethod
    def types(types: list[TensorType]) -> str:
        return str(types[0]) if len(types) == 1 else "(" + ", ".join(map(str, types)) + ")"

    def op(self, op: Operation, depth: int) -> None:
        pad = INDENT * depth
        lhs = ", ".join(f"%{r.name}" for r in op.results)
        text = f"{pad}{lhs + ' = ' if lhs else ''}{op.name}("
        text += ", ".join(f"%{v.name}" for v in op.operands) + ")"
        text += self.attr_dict(op)
        if op.results:
            text += " : " + self.types([r.type for r in op.results])
        if not op.regions:
            self.lines.append(text + self.loc(op.loc))
            return
        for region in op.regions:
            self.lines.append(f"{text} region ({self.args(region.args)}) {{")
            self.block(region, depth + 1)
            text = f"{pad}}}"
        self.lines.append(text + self.loc(op.loc))

    def block(self, block: Block, depth: int) -> None:
        for op in block.ops:
            self.op(op, depth)

    def function(self, fn: Function, depth: int) -> None:
        pad = INDENT * depth
        results = ", ".join(map(str, fn.result_types))
        self.lines.append(
            f"{pad}func @{fn.name}({self.args(fn.args)}) -> ({results}){self.loc(fn.loc)} {{"
        )
        self.block(fn.body, depth + 1)
        self.lines.append(f"{pad}}}")

    def module(self, module: Module) -> str:
        name = f" @{module.name}" if module.name else ""
        self.lines.append(f"module{name} {{")
        for mesh in module.meshes.values():
            self.lines.append(INDENT + mesh.declaration())
        for fn in module.functions.values():
            self.function(fn, 1)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"


def print_module(
    module: Module, resource_dir: str | Path | None = None, file_limit: int = FILE_LIMIT,
    external: dict[int, str] | None = None,
) -> str:
    """The module's text. With `resource_dir`, constants over `file_limit` bytes become files;
    constant arrays in `external` (id -> name) become references the parser binds by name."""
    return Printer(resource_dir, file_limit, external).module(module)


def print_op(op: Operation) -> str:
    """One op's line (regions included), for diagnostics and logs."""
    printer = Printer()
    printer.op(op, 0)
    return "\n".join(printer.lines)
