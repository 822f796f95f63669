"""The fused-region op: a group of ops that one kernel implements, visible in the printed IR.

    %y = fused(%x, %w, %b) {kind = "compute"} : f32[?b,3072] region (%a0: f32[?b,768], ...) {
      %0 = matmul(%a0, %a1) : f32[?b,3072]
      %1 = add(%0, %a2) : f32[?b,3072]
      %2 = gelu(%1) : f32[?b,3072]
      yield(%2)
    }

Region arguments stand for the operands in order; the region uses nothing from outside.
`members = K` (the horizontal-fusion pass) says the region is K independent copies of one
elementwise chain over tensors of different sizes, laid out member after member.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from tilefold.errors import VerificationError
from tilefold.ir.core import Block
from tilefold.ir.opdef import Attr, OpDef, RunRegion, register
from tilefold.ir.types import TensorType

KINDS = ("compute", "memory")


def yielded_types(region: Block) -> list[TensorType]:
    """The result types a fused op declares: what its region yields."""
    term = region.terminator
    if term is None or term.name != "yield":
        raise VerificationError("a fused region must end with 'yield'")
    return [v.type for v in term.operands]


@register
class Fused(OpDef):
    """A fused group: `kind` is "compute" (a GEMM with prologues/epilogues) or "memory"."""

    name = "fused"
    operands = ("*inputs",)
    attributes = MappingProxyType({
        "kind": Attr("str", "memory", choices=KINDS),
        "members": Attr("int", 1, doc="structurally identical elementwise chains the region "
                        "holds side by side, their arguments, ops and yields member after "
                        "member (horizontal fusion: one multi-tensor kernel runs them all)"),
    })
    traits = frozenset({"pure", "fused"})
    results = -1
    regions = 1

    @classmethod
    def infer_op(
        cls, types: list[TensorType], attrs: dict[str, Any], regions: Sequence[Block]
    ) -> list[TensorType]:
        if len(regions) != 1:
            raise VerificationError("fused: needs one region (the fusion pass builds them)")
        (region,) = regions
        if [a.type for a in region.args] != list(types):
            raise VerificationError("fused: region arguments must have the operands' types")
        return yielded_types(region)

    @classmethod
    def reference_op(cls, args: list[np.ndarray], attrs: dict[str, Any],
                     regions: Sequence[Block], run_region: RunRegion) -> Any:
        outs = run_region(regions[0], list(args))
        return outs if len(outs) != 1 else outs[0]
