"""Packing low-precision operands in generated code: B into k-group panels, A into row panels.

A k-group is one 32-bit word of `g` K-consecutive elements (g = 2 for bf16 and for 8-bit codes
widened to s16, 4 for 8-bit bytes). B[K, N] becomes NR-column panels of `kgp` word rows
(`NR * 4` bytes each, the VNNI layout the dot instructions read); A rows become MR-row panels
of 16-word chunks (MR x 64 bytes each: with MR = 16, an AMX tile stored contiguously, so a tile
load never strides across pages).
K, M and N tails are zero-filled by masked loads.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.lowp.amx import TILE_BYTES
from tilefold.target import Target

_P8 = u.i8.as_pointer()
PACK_B = "tf_lowp_pack_b"
PACK_A = "tf_lowp_pack_a"
PACK_B_ENTRY = "tf_lowp_pack_b_all"


def prefix_mask(b: ir.IRBuilder, count: ir.Value, lanes: int) -> ir.Value:
    """<lanes x i1> with the first `count` (i64, clamped to [0, lanes]) lanes set: one kmov."""
    bits = ir.IntType(lanes)
    count = u.smax(b, u.smin(b, count, u.const(lanes)), u.const(0))
    shift = b.trunc(count, bits) if lanes < 64 else count
    low = b.sub(b.shl(ir.Constant(bits, 1), shift), ir.Constant(bits, 1))
    full = b.icmp_signed(">=", count, u.const(lanes))
    return b.bitcast(b.select(full, ir.Constant(bits, -1), low), u.vec(u.i1, lanes))


def masked_load(b: ir.IRBuilder, ptr: ir.Value, mask: ir.Value, elem: ir.IntType) -> ir.Value:
    """The lanes of `mask` of a <lanes x elem> vector at byte pointer `ptr`, zeros elsewhere."""
    lanes = mask.type.count
    ty = u.vec(elem, lanes)
    fn = u.intrinsic(b.module, f"llvm.masked.load.v{lanes}i{elem.width}.p0", ty,
                     [ty.as_pointer(), u.i32, mask.type, ty])
    return b.call(fn, [b.bitcast(ptr, ty.as_pointer()), u.const(1, u.i32), mask,
                       ir.Constant(ty, [0] * lanes)])


def _interleave(b: ir.IRBuilder, rows: list[ir.Value]) -> ir.Value:
    """out[j * g + q] = rows[q][j]: g K-rows of one panel as k-group words (VNNI order)."""
    lanes, g = rows[0].type.count, len(rows)
    if g == 4:  # r0|r1 and r2|r3: one two-source shuffle then indexes r0|r1|r2|r3
        pair = ir.Constant(u.vec(u.i32, 2 * lanes), list(range(2 * lanes)))
        rows = [b.shuffle_vector(rows[0], rows[1], pair), b.shuffle_vector(rows[2], rows[3], pair)]
    order = [q * lanes + j for j in range(lanes) for q in range(g)]
    return b.shuffle_vector(rows[0], rows[1], ir.Constant(u.vec(u.i32, len(order)), order))


def emit_pack_b(module: ir.Module, nr: int, g: int, widen_bytes: bool = False) -> ir.Function:
    """`pack_b(src, ldb, k, n, kgp, p0, p1, dst)`: panels p0..p1 of B (`ldb` bytes a row) to
    dst + p * kgp * nr * 4, each `kgp` word rows of `nr` words (rows >= K and columns >= N 0).
    With `widen_bytes`, B holds s8 codes, each sign-extended to the word's 32 / g bits."""
    elem = ir.IntType(32 // g)
    src_elem = u.i8 if widen_bytes else elem
    es = src_elem.width // 8
    types = [_P8, u.i64, u.i64, u.i64, u.i64, u.i64, u.i64, _P8]
    fn = ir.Function(module, ir.FunctionType(u.void, types), name=PACK_B)
    fn.linkage = "internal"
    src, ldb, k, n, kgp, p0, p1, dst = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    row_bytes = nr * 4
    with u.for_range(b, p0, p1, 1, "p") as p:
        col0 = b.mul(p, u.const(nr))
        cols = b.sub(n, col0)
        base = u.gep(b, src, b.mul(col0, u.const(es)))
        out = u.gep(b, dst, b.mul(b.mul(p, kgp), u.const(row_bytes)))
        with u.for_range(b, u.const(0), kgp, 1, "kk") as kk:
            rows = []
            for q in range(g):
                kq = b.add(b.mul(kk, u.const(g)), u.const(q))
                valid = b.select(b.icmp_signed("<", kq, k), cols, u.const(0))
                row = masked_load(b, u.gep(b, base, b.mul(kq, ldb)), prefix_mask(b, valid, nr),
                                  src_elem)
                rows.append(b.sext(row, u.vec(elem, nr)) if widen_bytes else row)
            words = _interleave(b, rows)
            ptr = b.bitcast(u.gep(b, out, b.mul(kk, u.const(row_bytes))),
                            words.type.as_pointer())
            b.store(words, ptr, align=4)
    b.ret_void()
    return fn


# How A's codes become packed words (`emit_pack_a`): copied, widened to s16 pairs (u8 zero-,
# s8 sign-extended), or s8 flipped to u8 (+128, which the GEMM compensates).
A_CODES = ("copy", "zext", "sext", "flip")


def emit_pack_a(module: ir.Module, mr: int, code: str = "copy") -> ir.Function:
    """`pack_a(src, lda, m, kbytes, r0, rows, kgp, dst)`: A rows r0..r0+rows (r0 a multiple of
    `mr`; `lda` and `kbytes`, a row's codes, in bytes) as `mr`-row panels of `kgp` words (a
    multiple of 16): chunk kt of the panel of row r holds its words 16 kt .. 16 kt + 15, at dst +
    ((r - r0) / mr * kgp / 16 + kt) * mr * 64 + (r % mr) * 64 bytes. With mr = 16 a chunk is an
    AMX tile; rows >= M and codes past the row are 0 (0x80 when flipped: a zero B row meets it).
    """
    if code not in A_CODES:
        raise ValueError(f"A code {code!r} is not one of {', '.join(A_CODES)}")
    widen = code in ("zext", "sext")
    src_bytes = TILE_BYTES // 2 if widen else TILE_BYTES  # source bytes a 64-byte chunk holds
    types = [_P8, u.i64, u.i64, u.i64, u.i64, u.i64, u.i64, _P8]
    fn = ir.Function(module, ir.FunctionType(u.void, types), name=PACK_A)
    fn.linkage = "internal"
    src, lda, m, kbytes, r0, rows, kgp, dst = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    kts = b.sdiv(kgp, u.const(TILE_BYTES // 4))
    chunk = mr * TILE_BYTES
    with u.for_range(b, u.const(0), rows, 1, "r") as r:
        row = b.add(r0, r)
        in_m = b.icmp_signed("<", row, m)
        src_row = u.gep(b, src, b.mul(row, lda))
        panel_row = u.gep(b, dst, b.add(b.mul(b.mul(b.sdiv(r, u.const(mr)), kts), u.const(chunk)),
                                        b.mul(b.srem(r, u.const(mr)), u.const(TILE_BYTES))))
        with u.for_range(b, u.const(0), kts, 1, "kt") as kt:
            off = b.mul(kt, u.const(src_bytes))
            valid = b.select(in_m, b.sub(kbytes, off), u.const(0))
            data = masked_load(b, u.gep(b, src_row, off), prefix_mask(b, valid, src_bytes), u.i8)
            if widen:
                ext = b.sext if code == "sext" else b.zext
                data = b.bitcast(ext(data, u.vec(ir.IntType(16), src_bytes)),
                                 u.vec(u.i8, TILE_BYTES))
            elif code == "flip":
                data = b.xor(data, ir.Constant(data.type, [0x80] * TILE_BYTES))
            ptr = u.gep(b, panel_row, b.mul(kt, u.const(chunk)))
            b.store(data, b.bitcast(ptr, data.type.as_pointer()), align=64)
    b.ret_void()
    return fn


def pack_b_ir(nr: int, g: int, target: Target, widen_bytes: bool = False) -> str:
    """A module whose `tf_lowp_pack_b_all(src, ldb, k, n, kgp, dst)` packs every panel of B
    (one thread: for constant weights, packed once; `widen_bytes`: s8 codes to s16)."""
    module = ir.Module(name=f"tf_lowp_pack_b_{nr}x{g}{'_s8' if widen_bytes else ''}")
    module.triple = target.triple
    pack_b = emit_pack_b(module, nr, g, widen_bytes)
    types = [_P8, u.i64, u.i64, u.i64, u.i64, _P8]
    fn = ir.Function(module, ir.FunctionType(u.void, types), name=PACK_B_ENTRY)
    src, ldb, k, n, kgp, dst = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    panels = b.sdiv(b.add(n, u.const(nr - 1)), u.const(nr))
    b.call(pack_b, [src, ldb, k, n, kgp, u.const(0), panels, dst])
    b.ret_void()
    return str(module)
