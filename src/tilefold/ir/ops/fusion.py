"""The fused-region op: a group of ops that one kernel implements, visible in the printed IR.

    %y = fused(%x, %w, %b) {kind = "compute"} : f32[?b,3072] region (%a0: f32[?b,768], ...) {
      %0 = matmul(%a0, %a1) : f32[?b,3072]
      %1 = add(%0, %a2) : f32[?b,3072]
      %2 = gelu(%1) : f32[?b,3072]
      yield(%2)
    }

Region arguments stand for the operands in order; the region uses nothing from outside.
"""

from __future__ import annotations

import sys
from types import MappingProxyType
from typing import Any

from tilefold.errors import VerificationError
from tilefold.ir.core import Block, Operation
from tilefold.ir.opdef import Attr, OpDef, register
from tilefold.ir.types import TensorType

KINDS = ("compute", "memory")


def yielded_types(region: Block) -> list[TensorType]:
    """The result types a fused op declares: what its region yields."""
    term = region.terminator
    if term is None or term.name != "yield":
        raise VerificationError("a fused region must end with 'yield'")
    return [v.type for v in term.operands]


def _calling_op(opdef: type[OpDef], types: list[TensorType] | None = None) -> Operation:
    """The fused op whose `infer`/`reference` the IR is calling.

    `OpDef.infer(types, attrs)` and `reference(args, attrs, run_region)` do not receive the op's
    regions, which a region op needs; until the IR passes them (requested from the IR owner),
    the op is read from the caller's frame (the verifier's and the interpreter's local `op`).
    """
    frame = sys._getframe(2)
    while frame is not None:
        op = frame.f_locals.get("op")
        if isinstance(op, Operation) and op.opdef is opdef and op.regions and (
            types is None or [v.type for v in op.operands] == types
        ):
            return op
        frame = frame.f_back
    raise VerificationError("'fused' can only be inferred or run as part of an operation")


@register
class Fused(OpDef):
    """A fused group: `kind` is "compute" (a GEMM with prologues/epilogues) or "memory"."""

    name = "fused"
    operands = ("*inputs",)
    attributes = MappingProxyType({"kind": Attr("str", "memory", choices=KINDS)})
    traits = frozenset({"pure", "fused"})
    results = -1
    regions = 1

    @classmethod
    def infer(cls, types, attrs):
        region = _calling_op(cls, list(types)).regions[0]
        if [a.type for a in region.args] != list(types):
            raise VerificationError("fused: region arguments must have the operands' types")
        return yielded_types(region)

    @classmethod
    def reference(cls, args, attrs, run_region=None) -> Any:
        outs = run_region(_calling_op(cls).regions[0], args)
        return outs if len(outs) != 1 else outs[0]
