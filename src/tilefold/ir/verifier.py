"""Checks that a module obeys the IR's rules: op arity and attributes, SSA, types, terminators,
and placements that fit their tensors and declared meshes."""

from __future__ import annotations

from tilefold.errors import TilefoldError, VerificationError
from tilefold.ir.core import NAME, Block, Function, Module, Operation, Value
from tilefold.ir.printer import print_op
from tilefold.ir.types import SymDim, TensorType, sharding_problem


class Verifier:
    """Walks a module once; the first broken rule raises, located at the op that breaks it."""

    def __init__(self, module: Module):
        self.module = module

    def fail(self, message: str, where: Operation | Function | None = None) -> VerificationError:
        """An error at `where`'s text location, else its source `loc`, else quoting the op."""
        loc = getattr(where, "text_loc", None)
        if loc is not None:
            return VerificationError(message, loc, self.module.source_text)
        if isinstance(where, Operation):
            message += f"\n  in: {print_op(where).splitlines()[0].strip()}"
        return VerificationError(message, getattr(where, "loc", None))

    def module_(self) -> None:
        if self.module.name is not None and not NAME.fullmatch(self.module.name):
            raise self.fail(f"module name @{self.module.name} is not a valid name")
        for name, fn in self.module.functions.items():
            if name != fn.name or not NAME.fullmatch(fn.name):
                raise self.fail(f"function name @{fn.name} is not a valid name", fn)
            self.function(fn)

    def function(self, fn: Function) -> None:
        symbols = set().union(*(arg.type.symbols for arg in fn.args))
        self.block(fn.body, set(), set(), symbols, "return", fn)
        for i, t in enumerate(fn.result_types):
            self.placed(t, f"@{fn.name} result {i}", fn)
        ret = fn.return_op
        got = [v.type for v in ret.operands]
        if got != fn.result_types:
            shown = ", ".join(map(str, got))
            declared = ", ".join(map(str, fn.result_types))
            raise self.fail(f"@{fn.name} returns ({shown}) but declares ({declared})", ret)

    def define(self, value: Value, names: set[str], where: Operation | Function) -> None:
        if not NAME.fullmatch(value.name):
            raise self.fail(f"value name %{value.name} is not a valid name", where)
        if value.name in names:
            raise self.fail(f"value %{value.name} is defined twice", where)
        names.add(value.name)
        self.placed(value.type, f"%{value.name}", where)

    def placed(self, t: TensorType, what: str, where: Operation | Function) -> None:
        """A sharded type names a mesh of this module and fits it (see `sharding_problem`)."""
        if t.sharding is None:
            return
        mesh = t.sharding.mesh
        if self.module.meshes.get(mesh.name) != mesh:
            declared = self.module.meshes.get(mesh.name)
            why = f"declared as '{declared.declaration()}'" if declared else "not declared"
            raise self.fail(
                f"{what} of type {t} is placed on '{mesh.declaration()}', which this module has "
                f"{why}", where)
        problem = sharding_problem(t)
        if problem is not None:
            raise self.fail(f"{what} of type {t}: {problem}", where)

    def block(
        self,
        block: Block,
        visible: set[Value],
        names: set[str],
        symbols: set[str],
        term: str,
        owner: Operation | Function,
    ) -> None:
        """Check `block`; `visible` are the values its ops may use (dominance in straight line),
        `symbols` the symbolic dims its arguments define."""
        visible = set(visible)
        symbols = symbols.union(*(arg.type.symbols for arg in block.args))
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
            for region in op.regions:  # first, as a region op's types come from its regions
                self.block(region, set(), names, symbols, "yield", op)
            self.operation(op, symbols)
            for result in op.results:
                self.define(result, names, op)
                visible.add(result)

    def operation(self, op: Operation, symbols: set[str]) -> None:
        opdef = op.opdef
        try:
            attrs = opdef.check_signature(len(op.operands), op.attrs)
            if len(op.regions) != opdef.regions:
                raise VerificationError(f"'{op.name}' needs {opdef.regions} region(s)")
        except TilefoldError as exc:
            raise self.fail(exc.message, op) from None
        for key, spec in opdef.attributes.items():
            if spec.kind == "shape" and attrs.get(key) is not None:
                used = {d.name for d in attrs[key] if isinstance(d, SymDim)}
                self.bound(op, f"attribute '{key}'", used, symbols)
        try:
            types = [v.type for v in op.operands]
            inferred = opdef.infer_op(types, opdef.full_attrs(attrs), op.regions)
        except TilefoldError as exc:
            raise self.fail(exc.message, op) from None
        declared = [r.type for r in op.results]
        if not op.has_trait("sharding"):  # placements of ordinary ops are the sharding rules' job
            declared = [t.without_sharding() for t in declared]
            inferred = [t.without_sharding() for t in inferred]
        if [t.without_layout() for t in declared] != [t.without_layout() for t in inferred]:
            raise self.fail(
                f"'{op.name}' result type {', '.join(map(str, declared))} does not match the "
                f"inferred {', '.join(map(str, inferred))}",
                op,
            )
        for t in declared:
            self.bound(op, f"result {t}", t.symbols, symbols)

    def bound(self, op: Operation, what: str, used: set[str], symbols: set[str]) -> None:
        """Every symbolic dim `what` uses must get its size from an argument at run time."""
        unbound = sorted(n for n in used - symbols if not SymDim(n).free <= symbols)
        if unbound:
            raise self.fail(
                f"'{op.name}' {what} uses ?{unbound[0]}, which no argument type defines", op
            )


def verify(module: Module) -> Module:
    """Raise VerificationError (with location) on the first broken rule; return the module."""
    Verifier(module).module_()
    return module
