"""Checks that a module obeys the IR's rules: op arity and attributes, SSA, types, terminators."""

from __future__ import annotations

from tilefold.errors import TilefoldError, VerificationError
from tilefold.ir.core import Block, Function, Module, Operation, Value
from tilefold.ir.printer import print_op


class Verifier:
    def __init__(self, module: Module):
        self.module = module

    def fail(self, message: str, op: Operation | Function | None = None) -> VerificationError:
        loc = getattr(op, "text_loc", None)
        text = self.module.source_text if loc is not None else None
        if loc is None and isinstance(op, Operation):
            message += f"\n  in: {print_op(op).splitlines()[0].strip()}"
        return VerificationError(message, loc, text)

    def module_(self) -> None:
        for fn in self.module.functions.values():
            self.function(fn)

    def function(self, fn: Function) -> None:
        names: set[str] = set()
        self.block(fn.body, set(), names, "return", fn)
        ret = fn.return_op
        got = [v.type for v in ret.operands]
        if got != fn.result_types:
            shown = ", ".join(map(str, got))
            declared = ", ".join(map(str, fn.result_types))
            raise self.fail(
                f"@{fn.name} returns ({shown}) but declares ({declared})", ret
            )

    def define(self, value: Value, names: set[str], where) -> None:
        if value.name in names:
            raise self.fail(f"value %{value.name} is defined twice", where)
        names.add(value.name)

    def block(self, block: Block, visible: set[Value], names: set[str], term: str, owner) -> None:
        """Check `block`; `visible` are the values its ops may use (dominance in straight line)."""
        visible = set(visible)
        for arg in block.args:
            self.define(arg, names, owner)
            visible.add(arg)
        if not block.ops or block.ops[-1].name != term:
            where = block.ops[-1] if block.ops else owner
            raise self.fail(f"block must end with '{term}'", where)
        for op in block.ops:
            if op.has_trait("terminator") and op is not block.ops[-1]:
                raise self.fail(f"'{op.name}' must be the last op of its block", op)
            for operand in op.operands:
                if operand not in visible:
                    raise self.fail(
                        f"'{op.name}' uses %{operand.name} before it is defined (or from "
                        "outside its region)",
                        op,
                    )
            self.operation(op, names)
            for region in op.regions:
                self.block(region, set(), names, "yield", op)
            for result in op.results:
                self.define(result, names, op)
                visible.add(result)

    def operation(self, op: Operation, names: set[str]) -> None:
        opdef = op.opdef
        lo, hi = opdef.arity()
        n = len(op.operands)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"at least {lo}"
            raise self.fail(f"'{op.name}' takes {want} operands, got {n}", op)
        missing = [k for k, s in opdef.attributes.items() if s.required and k not in op.attrs]
        if missing:
            raise self.fail(f"'{op.name}' is missing attribute(s) {', '.join(missing)}", op)
        unknown = set(op.attrs) - set(opdef.attributes)
        if unknown:
            raise self.fail(f"'{op.name}' has no attribute(s) {', '.join(sorted(unknown))}", op)
        if len(op.regions) != opdef.regions:
            raise self.fail(f"'{op.name}' needs {opdef.regions} region(s)", op)
        try:
            inferred = opdef.infer([v.type for v in op.operands], opdef.full_attrs(op.attrs))
        except TilefoldError as exc:
            raise self.fail(exc.message, op) from None
        declared = [r.type for r in op.results]
        if [t.without_layout() for t in declared] != [t.without_layout() for t in inferred]:
            raise self.fail(
                f"'{op.name}' result type {', '.join(map(str, declared))} does not match the "
                f"inferred {', '.join(map(str, inferred))}",
                op,
            )


def verify(module: Module) -> Module:
    """Raise VerificationError (with location) on the first broken rule; return the module."""
    Verifier(module).module_()
    return module
