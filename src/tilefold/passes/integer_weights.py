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

Group-wise codes (torchao's `IntxWeightOnlyConfig`, int4 in groups of g along K) arrive as

    %w = reshape(mul(sub(cast(reshape(%q)), cast(reshape(%z))), reshape(%s)))   // [N, K]

with %q [N, K] and the scales %s and zero points %z [N, K/g] viewed as [N, K/g, 1]: that
becomes dequantize(%q, %s, %z), the codes stored as int4 where they fit (-8..7), the zero
points dropped where all are zero.
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
            b, transposed = _untransposed(op.operands[1])
            cast = b.defining_op
            if cast is not None and cast.name == "cast" and not transposed:
                inner, transposed = _untransposed(cast.operands[0])  # cast(transpose(codes))
                if transposed:
                    b = inner
            stored_b = op.attr("transpose_b") != transposed  # B as stored is [N, K]
            grouped = _grouped(b, self.min_elements) if stored_b else None
            mul = None
            if grouped is not None:
                arrays = list(grouped)
            else:
                codes = _codes(b, self.min_elements)
                if codes is None:
                    continue
                n = codes.shape[0] if stored_b else codes.shape[1]
                scale, mul = _column_scale(op, uses, n)
                shape = (n, 1) if stored_b else (1, n)
                arrays = [codes, np.ones(shape, np.float32) if scale is None
                          else scale.reshape(shape)]
            values = [rewriter.create(op, "constant", [], {"value": a}, loc=op.loc).results[0]
                      for a in arrays]
            deq = rewriter.create(op, "dequantize", values, {"dtype": dtypes.f32},
                                  loc=op.loc).results[0]
            op.operands = [op.operands[0], deq]
            op.attrs = {**op.attrs, "transpose_b": stored_b}
            if mul is not None:
                rewriter.replace(mul, [op.results[0]])
            self.count("num-rewritten")
        rewriter.erase_dead()


def _untransposed(b: Value) -> tuple[Value, bool]:
    """(the value a 2-D transpose reads, True), or (`b`, False)."""
    op = b.defining_op
    if op is not None and op.name == "transpose" and list(op.attr("perm")) == [1, 0]:
        return op.operands[0], True
    return b, False


def _codes(b: Value, min_elements: int) -> np.ndarray | None:
    """The 2-D constant i8 codes of which `b` is the f32 cast (or, where a transpose came
    between them, the codes themselves)."""
    codes = constant_of(b) if b.type.dtype == dtypes.i8 else _cast_source(b)
    if codes is None or codes.ndim != 2 or codes.size < min_elements:
        return None
    return codes


def _cast_source(v: Value | None) -> np.ndarray | None:
    """The constant i8 array (perhaps through a reshape) of which `v` is the f32 cast."""
    cast = v.defining_op if v is not None else None
    if cast is None or cast.name != "cast" or v.type.dtype != dtypes.f32:
        return None
    codes = _constant(cast.operands[0])
    return codes if codes is not None and codes.dtype == np.int8 else None


def _constant(v: Value) -> np.ndarray | None:
    """The constant `v` is, or is a reshape of (as its own array, not reshaped)."""
    value = constant_of(v)
    op = v.defining_op
    if value is None and op is not None and op.name == "reshape":
        value = constant_of(op.operands[0])
    return value


def _grouped(w: Value, min_elements: int) -> tuple[np.ndarray, ...] | None:
    """(codes [N, K], scales [N, G], and zero points [N, G] unless all zero) where `w` is
    reshape((cast(codes) - cast(zero points)) * scales) from [N, G, K/G] to [N, K]; int4
    codes where codes and zero points fit -8..7 and K is even."""
    op = w.defining_op
    if op is None or op.name != "reshape" or len(w.type.shape) != 2:
        return None
    (n, k), m = w.type.shape, op.operands[0]
    if len(m.type.shape) != 3 or m.type.shape[0] != n or m.type.shape[1] * m.type.shape[2] != k:
        return None
    groups = m.type.shape[1]
    mul = m.defining_op
    if mul is None or mul.name != "mul":
        return None
    for d, s in (mul.operands, mul.operands[::-1]):
        scale = _constant(s)
        if scale is None or scale.dtype != np.float32 or tuple(s.type.shape) != (n, groups, 1):
            continue
        sub = d.defining_op
        q, z = (sub.operands if sub is not None and sub.name == "sub" else (d, None))
        codes, zero = _cast_source(q), _cast_source(z)
        if codes is None or codes.size != n * k or codes.size < min_elements \
                or (z is not None and (zero is None or tuple(z.type.shape) != (n, groups, 1))):
            return None
        arrays = [codes.reshape(n, k), np.ascontiguousarray(scale.reshape(n, groups))]
        if zero is not None and zero.any():
            arrays.append(zero.reshape(n, groups))
        if k % 2 == 0 and all(a.min() >= -8 and a.max() <= 7 for a in arrays[::2]):
            for i in range(0, len(arrays), 2):
                arrays[i] = arrays[i].astype(dtypes.i4.np_dtype)
        elif len(arrays) > 2:  # i8 codes with zero points: no kernel reads them
            return None
        return tuple(arrays)
    return None


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
    value = _constant(other)
    if value is None or value.dtype != np.float32 or value.size != n \
            or other.type.shape[-1:] != (n,) or any(d != 1 for d in other.type.shape[:-1]):
        return None, None
    return np.ascontiguousarray(value.reshape(-1)), mul
