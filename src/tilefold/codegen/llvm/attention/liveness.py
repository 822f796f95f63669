"""Whether any of a set of mask rows keeps a key of a block: how attention skips masked blocks.

Both attention kernels ask it before reading a block of K and V: a static KV cache's mask is
False (or -inf) past the current position, so most of a long cache is never read. The rows
are a grid (outer x inner, each with its stride: a group's heads x query rows, or a task's
rows); a bool mask keeps True keys, a float one every key but -inf (NaN is kept: it must
reach the output); with the causal flag, row i also needs key j <= i.
"""

from __future__ import annotations

import math

from llvmlite import ir

from tilefold.codegen.llvm import util as u


def masked_load(b: ir.IRBuilder, ptr: ir.Value, ty: ir.VectorType,
                mask: ir.Value | None) -> ir.Value:
    """`ty` from `ptr` (a pointer to its element); under `mask` only, zeros elsewhere, if given."""
    vp = b.bitcast(ptr, ty.as_pointer())
    size = 4 if ty.element == u.f32 else ty.element.width // 8
    if mask is None:
        return b.load(vp, align=size)
    el = "f32" if ty.element == u.f32 else f"i{ty.element.width}"
    fn = u.intrinsic(b.module, f"llvm.masked.load.v{ty.count}{el}.p0", ty,
                     [ty.as_pointer(), u.i32, u.vec(u.i1, ty.count), ty])
    zero = ir.Constant(ty, [ty.element(0)] * ty.count)
    return b.call(fn, [vp, u.const(size, u.i32), mask, zero])


def block_live_fn(module: ir.Module, name: str, mask: str, causal: bool, lanes: int,
                  keys: int) -> ir.Function:
    """Define `name(base, outer, s_outer, inner, s_inner, i_first, j0, kn) -> i1`: whether row
    (o, i) at `base + o * s_outer + i * s_inner` (mask elements) keeps any of the keys
    [j0, j0 + kn), kn <= `keys`; with `causal`, that row's query index is `i_first + i`."""
    ety = u.i8 if mask == "bool" else u.f32
    fn = ir.Function(module, ir.FunctionType(u.i1, [ety.as_pointer()] + [u.i64] * 7), name=name)
    fn.linkage = "internal"
    base, outer, s_outer, inner, s_inner, i_first, j0, kn = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    width = keys if mask == "bool" else lanes  # one byte vector, or float vectors
    vecs = keys // width
    full = b.icmp_signed("==", kn, u.const(keys))
    zero = ir.Constant(u.vec(u.i1, width), [0] * width)
    with u.for_range_carry(b, u.const(0), outer, 1, [zero] * vecs, name="lo") as ol:
        orow = u.gep(b, base, b.add(b.mul(ol.index, s_outer), j0))
        with u.for_range_carry(b, u.const(0), inner, 1, ol.values, name="li") as il:
            row = u.gep(b, orow, b.mul(il.index, s_inner))
            i = b.add(i_first, il.index)
            keeps = []
            for c in range(vecs):
                lane = ir.Constant(u.vec(u.i64, width), list(range(c * width, (c + 1) * width)))
                inside = b.icmp_signed("<", lane, u.splat(b, kn, width))
                ptr = u.gep(b, row, c * width)
                with b.if_else(full) as (whole, part):  # only a last, partial block masks
                    with whole:
                        x, x_block = masked_load(b, ptr, u.vec(ety, width), None), b.block
                    with part:
                        y, y_block = masked_load(b, ptr, u.vec(ety, width), inside), b.block
                m = b.phi(x.type)
                m.add_incoming(x, x_block)
                m.add_incoming(y, y_block)
                if mask == "bool":
                    keep = b.icmp_unsigned("!=", m, ir.Constant(m.type, [0] * width))
                else:
                    keep = b.fcmp_unordered("!=", m, ir.Constant(m.type, [-math.inf] * width))
                keep = b.and_(keep, inside)
                if causal:
                    keep = b.and_(keep, b.icmp_signed("<=", b.add(lane, u.splat(b, j0, width)),
                                                      u.splat(b, i, width)))
                keeps.append(b.or_(il.values[c], keep))
            il.next = keeps
        ol.next = il.result
    seen = ol.result[0]
    for x in ol.result[1:]:
        seen = b.or_(seen, x)
    bits = b.bitcast(seen, ir.IntType(width))
    b.ret(b.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0)))
    return fn
