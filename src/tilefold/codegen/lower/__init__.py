"""Lowering graph ops once, by table, for every kernel generator (see `rules.py`)."""

from tilefold.codegen.lower.primitives import (
    BOOL_PRIMITIVES,
    EXPENSIVE_PRIMITIVES,
    PRIMITIVES,
    Primitive,
)
from tilefold.codegen.lower.rules import RULES, Context, Rule, lower_op, op_flops

__all__ = ["BOOL_PRIMITIVES", "EXPENSIVE_PRIMITIVES", "PRIMITIVES", "RULES", "Context",
           "Primitive", "Rule", "lower_op", "op_flops"]
