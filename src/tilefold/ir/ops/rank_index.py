"""spmd.axis_index: the one value of a per-rank program that differs between ranks, a rank's
position along a mesh axis (as jax.lax.axis_index), from which per-rank ops compute offsets.

    %k = spmd.axis_index() {axis = "tp", size = 4} : i64[]      // 0, 1, 2 or 3

A per-rank gather from a table split by rows reads it to know which rows it holds
(`distributed/per_rank.py`). Like the per-rank collectives it has no meaning on one rank alone:
the simulated mesh (`run_ranks`) gives each rank its coordinate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import UnsupportedError, VerificationError
from tilefold.ir.opdef import Attr, OpDef, attr_table, register
from tilefold.ir.types import TensorType


@register
class AxisIndex(OpDef):
    """This rank's coordinate along mesh axis `axis` (which has `size` devices), a scalar of
    integer type `dtype`."""

    name = "spmd.axis_index"
    operands = ()
    attributes = attr_table(axis=Attr("str", doc="the mesh axis"),
                            size=Attr("int", doc="how many devices the axis has"),
                            dtype=Attr("dtype", dtypes.i64, doc="the integer type of the result"))
    traits = frozenset({"per_rank"})  # not "pure": folding it would give every rank rank 0's

    @classmethod
    def infer(cls, types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        if attrs["size"] < 1:
            raise VerificationError(f"'{cls.name}' size {attrs['size']}: an axis has at least "
                                    "one device")
        if not attrs["dtype"].is_integer:
            raise VerificationError(f"'{cls.name}' gives an integer, not {attrs['dtype']}")
        return [TensorType((), attrs["dtype"])]

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        raise UnsupportedError(
            f"'{cls.name}' is a rank's position on axis {attrs['axis']}, which one process "
            "alone does not have: run the per-rank program with tilefold.distributed.run_ranks, "
            "or make it one rank's first (tilefold.distributed.bind_rank)"
        )
