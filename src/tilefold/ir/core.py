"""The IR's data structures: values, operations, blocks, functions and modules (typed SSA)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tilefold.errors import Location
from tilefold.ir.types import Mesh, TensorType

if TYPE_CHECKING:
    from tilefold.ir.opdef import OpDef

NAME = re.compile(r"[A-Za-z0-9_.$-]+")  # value, function and module names, as the text spells them


class Value:
    """An SSA value: a function/block argument or an operation result, with a unique name."""

    __slots__ = ("index", "name", "owner", "type")

    def __init__(self, type: TensorType, name: str, owner: Operation | Block | None, index: int):
        self.type = type
        self.name = name
        self.owner = owner
        self.index = index

    @property
    def defining_op(self) -> Operation | None:
        return self.owner if isinstance(self.owner, Operation) else None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Operation:
    """One op instance: an `OpDef` with operands, attributes, results and optional regions.

    `loc` is the source location carried in the IR text (`loc(...)`); `text_loc` is where the op
    was parsed from, used only for diagnostics and never printed.
    """

    __slots__ = ("attrs", "loc", "opdef", "operands", "parent", "regions", "results", "text_loc")

    def __init__(
        self,
        opdef: type[OpDef],
        operands: list[Value],
        attrs: dict[str, Any],
        result_types: list[TensorType],
        result_names: list[str],
        regions: list[Block] | None = None,
        loc: Location | None = None,
    ):
        self.opdef = opdef
        self.operands = list(operands)
        self.attrs = dict(attrs)
        self.results = [
            Value(t, n, self, i)
            for i, (t, n) in enumerate(zip(result_types, result_names, strict=True))
        ]
        self.regions = list(regions or [])
        for region in self.regions:
            region.parent_op = self
        self.loc = loc
        self.text_loc: Location | None = None
        self.parent: Block | None = None

    @property
    def name(self) -> str:
        return self.opdef.name

    @property
    def result(self) -> Value:
        """The single result of a one-result op."""
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def has_trait(self, trait: str) -> bool:
        return trait in self.opdef.traits

    def attr(self, key: str) -> Any:
        """An attribute's value, or its declared default when the op does not set it."""
        if key in self.attrs:
            return self.attrs[key]
        return self.opdef.attributes[key].default

    def reduced_axes(self) -> tuple[int, ...]:
        """The axes of operand 0 this "reduction" op reduces over (`OpDef.reduced_axes`)."""
        rank = self.operands[0].type.rank
        return self.opdef.reduced_axes(rank, self.opdef.full_attrs(self.attrs))

    def erase(self) -> None:
        """Remove this op from its block; its results must be unused by then."""
        assert self.parent is not None, f"{self.name} is not in a block"
        self.parent.remove(self)

    def walk(self) -> Iterator[Operation]:
        """This op, then every op nested in its regions, in order."""
        yield self
        for region in self.regions:
            yield from region.walk()

    def __repr__(self) -> str:
        return f"<{self.name} -> {', '.join(map(repr, self.results))}>"


class Block:
    """A straight-line list of operations with typed arguments; the last op is a terminator."""

    def __init__(self, args: list[Value] | None = None):
        self.args: list[Value] = []
        self.ops: list[Operation] = []
        self.parent_op: Operation | None = None
        for arg in args or []:
            self.add_arg(arg)

    def add_arg(self, arg: Value) -> Value:
        arg.owner, arg.index = self, len(self.args)
        self.args.append(arg)
        return arg

    def append(self, op: Operation) -> Operation:
        op.parent = self
        self.ops.append(op)
        return op

    def insert(self, index: int, op: Operation) -> Operation:
        op.parent = self
        self.ops.insert(index, op)
        return op

    def remove(self, op: Operation) -> None:
        """Take `op` out of this block (ValueError if it is not there)."""
        self.ops.remove(op)
        op.parent = None

    @property
    def terminator(self) -> Operation | None:
        return self.ops[-1] if self.ops and self.ops[-1].has_trait("terminator") else None

    def walk(self) -> Iterator[Operation]:
        for op in list(self.ops):
            yield from op.walk()


class Function:
    """A named SSA graph: arguments, a body block ending in `return`, and declared result types."""

    def __init__(self, name: str, args: list[Value], result_types: list[TensorType]):
        self.name = name
        self.body = Block(args)
        self.result_types = list(result_types)
        self.loc: Location | None = None
        self.text_loc: Location | None = None

    @property
    def args(self) -> list[Value]:
        return self.body.args

    @property
    def ops(self) -> list[Operation]:
        return self.body.ops

    @property
    def return_op(self) -> Operation | None:
        return self.body.terminator

    @property
    def outputs(self) -> list[Value]:
        ret = self.return_op
        return list(ret.operands) if ret is not None else []

    def walk(self) -> Iterator[Operation]:
        return self.body.walk()

    def values(self) -> Iterator[Value]:
        """Every value the function defines: arguments, results, region arguments."""
        yield from self.args
        for op in self.walk():
            for region in op.regions:
                yield from region.args
            yield from op.results

    def fresh_name(self, hint: str = "") -> str:
        """A value name not used in this function yet (`%0`, `%1`, ... or `hint`, `hint1`, ...)."""
        taken = {v.name for v in self.values()}
        if hint and hint not in taken:
            return hint
        n = 0
        while f"{hint}{n}" in taken:
            n += 1
        return f"{hint}{n}"

    def uses(self) -> dict[Value, list[Operation]]:
        """Map each used value to the ops that use it (computed on demand; graphs are small)."""
        table: dict[Value, list[Operation]] = {}
        for op in self.walk():
            for operand in op.operands:
                table.setdefault(operand, []).append(op)
        return table

    def replace_all_uses(self, old: Value, new: Value) -> None:
        for op in self.walk():
            if old in op.operands:  # Values compare by identity
                op.operands = [new if v is old else v for v in op.operands]


class Module:
    """A collection of functions, the unit that is printed, parsed, passed over and compiled;
    `meshes` are the device meshes its sharded types may name."""

    def __init__(self, name: str | None = None, functions: list[Function] | None = None):
        self.name = name
        self.functions: dict[str, Function] = {}
        self.meshes: dict[str, Mesh] = {}
        self.source_text: str | None = None
        self.source_name: str | None = None
        for fn in functions or []:
            self.add(fn)

    def add(self, fn: Function) -> Function:
        self.functions[fn.name] = fn
        return fn

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]

    def walk(self) -> Iterator[Operation]:
        for fn in self.functions.values():
            yield from fn.walk()

    def __str__(self) -> str:
        from tilefold.ir.printer import print_module

        return print_module(self)
