"""A `Problem`: one fused group (or lone op) at concrete shapes, the unit methods compete on."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tilefold.errors import ShapeError
from tilefold.ir import Operation, Value
from tilefold.ir.dims import Bindings
from tilefold.ir.printer import Printer
from tilefold.ir.types import SymDim, TensorType


def bind_shapes(params: Sequence[Value], shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
    """Symbolic dim sizes implied by giving `params` these concrete shapes."""
    bindings = Bindings()
    for param, shape in zip(params, shapes, strict=True):
        for d, size in zip(param.type.shape, shape, strict=True):
            if isinstance(d, SymDim) and bindings.bind(d.name, size) != size:
                raise ShapeError(f"?{d.name} is both {bindings[d.name]} and {size}")
    bindings.check("inputs")
    return bindings


def shape_bucket(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Dims rounded up to a power of two past 16, so nearby shapes share tuning results."""
    return tuple(d if d <= 16 else 1 << (d - 1).bit_length() for d in shape)


@dataclass(frozen=True, eq=False)
class Problem:
    """`op` (a `fused` op or a lone op) with every value's concrete type.

    `body` is the ops a kernel must implement, in order; `inputs`/`outputs` are the values a
    kernel reads and writes (region arguments and yielded values for a fused op).
    """

    op: Operation
    body: tuple[Operation, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    types: dict[Value, TensorType]
    bindings: dict[str, int]
    constants: dict[Value, np.ndarray]

    @staticmethod
    def of(op: Operation, shapes: Sequence[tuple[int, ...]],
           outer: dict[str, int] | None = None) -> Problem:
        """The problem `op` poses when its operands have `shapes`; `outer` are the enclosing
        function's symbolic dim sizes (attributes such as `arange {shape = [?s]}` use them
        without any operand carrying the dim)."""
        if op.name == "fused":
            region = op.regions[0]
            inputs, body = tuple(region.args), tuple(region.ops[:-1])
            outputs = tuple(region.ops[-1].operands)
        else:
            inputs, body, outputs = tuple(op.operands), (op,), tuple(op.results)
        constants = {
            inner: outer.defining_op.attrs["value"]
            for inner, outer in zip(inputs, op.operands, strict=True)
            if outer.defining_op is not None and outer.defining_op.name == "constant"
        }
        bindings = Bindings({**(outer or {}), **bind_shapes(inputs, shapes)})
        types = {v: v.type.bind(bindings) for v in inputs}
        for inner in body:
            for r in inner.results:
                types[r] = r.type.bind(bindings)
        return Problem(op, body, inputs, outputs, types, bindings, constants)

    @property
    def kind(self) -> str:
        return self.op.attr("kind") if self.op.name == "fused" else "single"

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.body)

    def not_lone(self, name: str) -> str | None:
        """Why this group is not one `name` op alone (a pattern method's first check), or None."""
        if self.names == (name,):
            return None
        return f"pattern is a lone {name}; this group is " + " -> ".join(self.names)

    def attrs(self, op: Operation) -> dict:
        """`op`'s attributes with defaults filled and symbolic dims bound to sizes."""
        return {
            k: tuple(self.bindings[d.name] if isinstance(d, SymDim) else d for d in v)
            if isinstance(v, tuple) and any(isinstance(d, SymDim) for d in v) else v
            for k, v in op.opdef.full_attrs(op.attrs).items()
        }

    def shape(self, v: Value) -> tuple[int, ...]:
        return self.types[v].shape  # type: ignore[return-value]

    def in_types(self) -> list[TensorType]:
        return [self.types[v] for v in self.inputs]

    def out_types(self) -> list[TensorType]:
        return [self.types[v] for v in self.outputs]

    def first(self, name: str) -> Operation | None:
        return next((o for o in self.body if o.name == name), None)

    def elements(self, v: Value) -> int:
        return math.prod(self.shape(v))

    @functools.cached_property
    def signature(self) -> str:
        """The body as text with values numbered by position: equal for equal computations."""
        number = {v: f"a{i}" for i, v in enumerate(self.inputs)}
        printer = Printer()
        parts = []
        for inner in self.body:
            for r in inner.results:
                number[r] = f"v{len(number)}"
            args = ",".join(number[v] for v in inner.operands)
            parts.append(f"{inner.name}({args}){printer.attr_dict(inner).strip()}")
        outs = ",".join(number[v] for v in self.outputs)
        dtypes = ",".join(str(t.dtype) for t in self.in_types())
        return f"{';'.join(parts)} -> {outs} [{dtypes}]"

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(self.shape(v) for v in self.inputs)

    def kernel_symbol(self, prefix: str) -> str:
        """A symbol for this problem's kernel, stable across processes (so the disk cache
        hits): `prefix` and a hash of the signature and shapes."""
        text = f"{self.signature}|{self.shapes}"
        return f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def describe(self) -> str:
        ins = ", ".join(str(t) for t in self.in_types())
        return f"{' -> '.join(self.names)} on ({ins})"
