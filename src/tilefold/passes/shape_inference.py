"""shape-inference: recompute every result type from its operands, optionally binding symbols.

With `bind=batch=8`, every `?batch` in the function signatures and in shape attributes becomes
8, and the types downstream follow: a function for any batch size is specialized to one.
"""

from __future__ import annotations

import logging

from tilefold.errors import PassError, TilefoldError
from tilefold.ir import Block, Function, Module, Operation
from tilefold.ir.types import Dim, bind_dim
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.registry import register_pass

log = logging.getLogger("tilefold.passes")


@register_pass
class ShapeInference(Pass):
    """Re-infer result types from operands; bind symbolic dims to sizes."""

    options = (Option("bind", dict, {}, "symbolic dims to specialize, e.g. bind=batch=8,seq=128"),)
    statistics = (
        Statistic("num-bound", "arguments whose type was specialized by bind"),
        Statistic("num-refined", "results whose type changed"),
    )
    bind: dict[str, int]

    def run(self, module: Module) -> None:
        self.check_bindings(module)
        for fn in module.functions.values():
            try:
                self.run_on_function(fn)
            except TilefoldError as exc:
                raise PassError(
                    f"shape-inference: {exc.message}",
                    exc.loc,
                    module.source_text if exc.loc else None,
                ) from None

    def check_bindings(self, module: Module) -> None:
        """A bound name the module never uses is likely a typo: warn, naming those it has."""
        symbols = {
            s for fn in module.functions.values() for v in fn.values() for s in v.type.symbols
        }
        unknown = sorted(set(self.bind) - symbols)
        if unknown:
            have = ", ".join(f"?{s}" for s in sorted(symbols)) or "none"
            log.warning(
                "shape-inference: bind names ?%s, which the module does not use (its symbolic "
                "dims: %s)",
                ", ?".join(unknown),
                have,
            )

    def run_on_function(self, fn: Function) -> None:
        self.run_on_block(fn.body)
        fn.result_types = [v.type for v in fn.outputs]

    def run_on_block(self, block: Block) -> None:
        """Bind the block's arguments, then infer its ops in order, each after its regions
        (a region op's types may come from what its region yields)."""
        self.bind_args(block)
        for op in block.ops:
            for region in op.regions:
                self.run_on_block(region)
            self.infer(op)

    def bind_args(self, block: Block) -> None:
        for arg in block.args:
            bound = arg.type.bind(self.bind)
            if bound != arg.type:
                arg.type = bound
                self.count("num-bound")

    def bind_dims(self, shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
        return tuple(bind_dim(d, self.bind) for d in shape)

    def infer(self, op: Operation) -> None:
        """Bind shape attributes, then take the types the op's declaration infers."""
        for key, spec in op.opdef.attributes.items():
            if spec.kind == "shape" and key in op.attrs:
                op.attrs[key] = self.bind_dims(op.attrs[key])
        try:
            attrs = op.opdef.full_attrs(op.attrs)
            types = op.opdef.infer_op([v.type for v in op.operands], attrs, op.regions)
        except TilefoldError as exc:
            raise type(exc)(exc.message, op.text_loc) from None  # at the op, not its definition
        for result, inferred in zip(op.results, types, strict=True):
            if inferred.without_layout() != result.type.without_layout():
                result.type = inferred
                self.count("num-refined")
