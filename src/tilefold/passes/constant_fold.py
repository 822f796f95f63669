"""constant-fold: evaluate ops whose operands are all constants, using the op's reference.

The reference interpreter defines what an op means, so folding with it changes no result. Ops
whose results would exceed `size-limit` elements stay as they are, so that a broadcast of a
scalar to a huge shape is not materialized in the IR. A `dequantize` is never folded: its
codes are a weight stored compactly on purpose (weight-only layers), which the GEMM decodes in
registers; folding would store the f32 weight instead.
"""

from __future__ import annotations

import logging

import numpy as np

from tilefold.errors import TilefoldError
from tilefold.ir import Function, Operation
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter, constant_of, is_removable

log = logging.getLogger("tilefold.passes")

UNFOLDED = frozenset({"dequantize"})  # ops whose constant operands are kept as they are


@register_pass
class ConstantFold(Pass):
    """Replace ops whose operands are all constants by the constants they compute."""

    options = (Option("size-limit", int, 1 << 16, "largest result, in elements, to materialize"),)
    statistics = (
        Statistic("num-folded", "ops replaced by constants"),
        Statistic("num-too-large", "foldable ops left alone because of size-limit"),
    )
    size_limit: int

    def run_on_function(self, fn: Function) -> None:
        rewriter = Rewriter(fn)
        for op in list(fn.walk()):  # in order, so a folded result feeds the next fold
            if op.name == "constant" or op.name in UNFOLDED or op.regions or \
                    not is_removable(op):
                continue
            arrays = [constant_of(v) for v in op.operands]
            if any(a is None for a in arrays):
                continue
            if not all(r.type.is_static and r.type.strides is None for r in op.results):
                continue
            if sum(r.type.num_elements for r in op.results) > self.size_limit:
                self.count("num-too-large")
                continue
            values = self.evaluate(op, arrays)
            if values is not None:
                names = [r.name for r in op.results]
                folded = [
                    rewriter.create(op, "constant", [], {"value": v}, [n], op.loc).results[0]
                    for v, n in zip(values, names, strict=True)
                ]
                rewriter.replace(op, folded)
                self.count("num-folded")

    @staticmethod
    def evaluate(op: Operation, arrays: list[np.ndarray]) -> list[np.ndarray] | None:
        """The op's results as fresh arrays, or None when the reference refuses the inputs
        (the error then surfaces when the program runs, not at compile time)."""
        try:
            out = op.opdef.reference(arrays, op.opdef.full_attrs(op.attrs))
        except TilefoldError as exc:
            log.debug("constant-fold: leaving %s: %s", op.name, exc.message)
            return None
        outs = list(out) if isinstance(out, list | tuple) else [out]
        values = [np.array(v, order="C") for v in outs]
        for value, result in zip(values, op.results, strict=True):
            want = result.type
            assert value.shape == want.shape and value.dtype == want.dtype.np_dtype, (
                f"{op.name} reference gave {value.dtype}{list(value.shape)} for {want}"
            )
        return values
