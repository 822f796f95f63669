"""integer-weights: a matmul of a float cast of constant int8 codes becomes a weight-only matmul.

Models quantized outside tilefold arrive with the dequantization spelled out in ordinary ops:
torchao's int8 weight-only layers (`Int8WeightOnlyConfig`) lower to a cast of the int8 codes,
a matmul and a product by one scale per output channel. Constant folding would turn the cast
into an f32 weight, four times the bytes a decode step streams. The rewrite keeps the codes:

    %t = transpose(%q) {perm = [1, 0]}              %d = dequantize(%q, %s) {dtype = "f32"}
    %w = cast(%t) {dtype = "f32"}               ->  %m = matmul(%x, %d) {transpose_b = true}
    %m = matmul(%x, %w)
    %y = mul(%m, %c)   // c: a constant, one value per column of m

with %q a constant of i8 codes and %s the per-channel scales (from %c, whose product then goes;
ones where the matmul's result is used otherwise). The weight-only kernels stream the codes
and apply the scales; x (q s) and (x q) s differ only in rounding. Codes smaller than
`min-elements` stay casts (constant folding makes them f32).
"""

from __future__ import annotations

import numpy as np

from tilefold import dtypes
from tilefold.ir import Function, Operation, Value
from tilefold.passes.base import Option, Pass, Statistic
from tilefold.passes.registry import register_pass
from tilefold.passes.rewrite import Rewriter, constant_of


@register_pass
class IntegerWeights(Pass):
    """Run matmuls of float casts of constant int8 codes as weight-only matmuls."""

    options = (Option("min-elements", int, 1 << 12, "smallest weight, in elements, to keep"),)
    statistics = (Statistic("num-rewritten", "matmuls whose B became a dequantize of codes"),)

    def run_on_function(self, fn: Function) -> None:
        rewriter = Rewriter(fn)
        uses = fn.uses()
        for op in list(fn.body.ops):
            if op.name != "matmul" or op.attr("transpose_a") \
                    or op.operands[0].type.dtype != dtypes.f32:
                continue
            found = _codes(op.operands[1], self.min_elements)
            if found is None:
                continue
            codes, transposed = found
            stored_b = op.attr("transpose_b") != transposed  # B's [N, K] layout, as stored
            n = codes.shape[0] if stored_b else codes.shape[1]
            scale, mul = _column_scale(op, uses, n)
            shape = (n, 1) if stored_b else (1, n)
            scale = np.ones(shape, np.float32) if scale is None else scale.reshape(shape)
            q = rewriter.create(op, "constant", [], {"value": codes}, loc=op.loc).results[0]
            s = rewriter.create(op, "constant", [], {"value": scale}, loc=op.loc).results[0]
            deq = rewriter.create(op, "dequantize", [q, s], {"dtype": dtypes.f32},
                                  loc=op.loc).results[0]
            op.operands = [op.operands[0], deq]
            op.attrs = {**op.attrs, "transpose_b": stored_b}
            if mul is not None:
                rewriter.replace(mul, [op.results[0]])
            self.count("num-rewritten")
        rewriter.erase_dead()


def _codes(b: Value, min_elements: int) -> tuple[np.ndarray, bool] | None:
    """(codes, transposed) when `b` is an f32 cast of 2-D constant i8 codes, perhaps through
    a transpose of them."""
    cast = b.defining_op
    if cast is None or cast.name != "cast" or b.type.dtype != dtypes.f32:
        return None
    src = cast.operands[0]
    transposed = False
    op = src.defining_op
    if op is not None and op.name == "transpose" and list(op.attr("perm")) == [1, 0]:
        src, transposed = op.operands[0], True
    codes = constant_of(src)
    if codes is None or codes.ndim != 2 or codes.dtype != np.int8 or codes.size < min_elements:
        return None
    return codes, transposed


def _column_scale(mm: Operation, uses: dict, n: int) -> tuple[np.ndarray | None, Operation | None]:
    """The f32 constant, one value per column, that the matmul's only use multiplies it by
    (looking through a reshape of the constant), and that `mul`; else (None, None)."""
    users = uses.get(mm.results[0], [])
    if len(users) != 1 or users[0].name != "mul":
        return None, None
    mul = users[0]
    other = next((v for v in mul.operands if v is not mm.results[0]), None)
    if other is None or mul.results[0].type != mm.results[0].type:
        return None, None
    value = constant_of(other)
    op = other.defining_op
    if value is None and op is not None and op.name == "reshape":
        value = constant_of(op.operands[0])
    if value is None or value.dtype != np.float32 or value.size != n \
            or other.type.shape[-1:] != (n,) or any(d != 1 for d in other.type.shape[:-1]):
        return None, None
    return np.ascontiguousarray(value.reshape(-1)), mul
