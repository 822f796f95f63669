"""ISA-blind packing of A and B blocks into f32 micro-panels, from any element strides and
from f32, bf16 or f16 sources (widened exactly while copying).

Packed A: panels of MR rows, k-major (`mr` floats per k); the last rows form smaller panels of the
kernel's tail heights (7 = 4 + 2 + 1), so no row is padded.
Packed B: panels of NR columns, k-major (`w` floats per k, `w` = the panel's width rounded up
to whole vectors, the padding lanes zeroed); this is also the layout `prepack` produces.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from tilefold.codegen.llvm import util as u

_FP = u.f32.as_pointer()


@dataclass(frozen=True)
class Source:
    """An element type packing reads, and how it widens to f32 (exactly, for all three)."""

    name: str
    elem: ir.Type
    size: int  # bytes

    @property
    def ptr(self) -> ir.PointerType:
        return self.elem.as_pointer()

    def widen(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """f32 scalar or vector of `x`: bf16 is the high half of an f32's bits; f16 is
        `fpext` (F16C `vcvtph2ps` on x86, `fcvtl` on AArch64)."""
        if self.name == "f32":
            return x
        lanes = x.type.count if isinstance(x.type, ir.VectorType) else None
        f32 = u.f32 if lanes is None else u.vec(u.f32, lanes)
        if self.name == "f16":
            return b.fpext(x, f32)
        i32 = u.i32 if lanes is None else u.vec(u.i32, lanes)
        bits = b.shl(b.zext(x, i32), ir.Constant(i32, 16 if lanes is None else [16] * lanes))
        return b.bitcast(bits, f32)

    def load(self, b: ir.IRBuilder, ptr: ir.Value, lanes: int = 0) -> ir.Value:
        """The f32 value at `ptr` (a pointer to this element), or `lanes` of them."""
        if lanes:
            ptr = b.bitcast(ptr, u.vec(self.elem, lanes).as_pointer())
        return self.widen(b, b.load(ptr, align=self.size))

    def masked_load(self, b: ir.IRBuilder, ptr: ir.Value, mask: ir.Value, lanes: int
                    ) -> ir.Value:
        """`lanes` f32 values at `ptr` where `mask` is set, zeros elsewhere."""
        if self.name == "f32":
            return u.masked_load(b, u.vptr(b, ptr, lanes), mask, lanes)
        vty = u.vec(self.elem, lanes)
        kind = "f16" if self.name == "f16" else "i16"
        fn = u.intrinsic(b.module, f"llvm.masked.load.v{lanes}{kind}.p0", vty,
                         [vty.as_pointer(), u.i32, u.vec(u.i1, lanes), vty])
        x = b.call(fn, [b.bitcast(ptr, vty.as_pointer()), u.const(self.size, u.i32), mask,
                        ir.Constant(vty, None)])
        return self.widen(b, x)


SOURCES = {"f32": Source("f32", u.f32, 4), "bf16": Source("bf16", ir.IntType(16), 2),
           "f16": Source("f16", ir.HalfType(), 2)}
F32 = SOURCES["f32"]


def pack_type(src: Source) -> ir.FunctionType:
    """pack(rows/k, cols, src, row stride, col stride, dst): strides in source elements."""
    return ir.FunctionType(u.void, [u.i64, u.i64, src.ptr, u.i64, u.i64, _FP])


def _bytes(ptr: ir.Value) -> int:
    ty = ptr.type.pointee
    return 4 if ty == u.f32 else next(s.size for s in SOURCES.values() if s.elem == ty)


@contextmanager
def _stepping(b: ir.IRBuilder, count: ir.Value, pointers: tuple, steps: tuple,
              name: str = "k") -> Iterator[list[ir.Value]]:
    """`count` iterations over `pointers`, each advanced by its step (in elements) per iteration
    in registers: the module is compiled without LLVM's loop strength reduction, which would
    otherwise have to turn `base + i * stride` into this.

    The steps are scaled to bytes before the loop: a float-indexed step becomes a scaled `lea`
    on x86, whose latency on the loop-carried pointer made a strided copy 28% slower."""
    byte_steps = [u.const(_bytes(p) * step) if isinstance(step, int)
                  else b.mul(step, u.const(_bytes(p)))
                  for p, step in zip(pointers, steps, strict=True)]
    with u.for_range_carry(b, u.const(0), count, 1, list(pointers), name) as loop:
        yield loop.values
        loop.next = [b.bitcast(b.gep(b.bitcast(p, u.i8.as_pointer()), [step], inbounds=True),
                               p.type)
                     for p, step in zip(loop.values, byte_steps, strict=True)]


def _new(module: ir.Module, name: str, arg_names: tuple[str, ...], src: Source
         ) -> tuple[ir.Function, ...]:
    fn = ir.Function(module, pack_type(src), name=name)
    for arg, n in zip(fn.args, arg_names, strict=True):
        arg.name = n
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def emit_pack_a(module: ir.Module, m_sizes: tuple[int, ...], name: str = "tf_pack_a",
                row_major: bool = True, src: Source = F32) -> ir.Function:
    """pack_a(mc, kc, A, rsa, csa, dst): A[mc, kc] -> panels of `m_sizes` rows.

    `row_major=False` leaves out the in-register transposes for A with contiguous rows (such A
    is then gathered per k like any strided A): for kernels that plans never give it to, as
    the transposes' shuffles are a sixth of the module's compile time."""
    fn, b = _new(module, name, ("mc", "kc", "src", "rs", "cs", "dst"), src)
    mc, kc, a, rs, cs, dst = fn.args
    mr_max = m_sizes[0]
    with u.for_chunks(b, u.const(0), mc, m_sizes, "ir") as (ir_, mr):
        d = u.gep(b, dst, b.mul(ir_, kc))
        s = u.gep(b, a, b.mul(ir_, rs))
        full = b.icmp_signed("==", mr, u.const(mr_max))
        with b.if_else(full) as (then, other):
            with then:
                _pack_a_full(b, mr_max, kc, s, rs, cs, d, row_major, src)
            with other, _stepping(b, kc, (s, d), (cs, mr)) as (sk, dk), \
                    _stepping(b, mr, (sk, dk), (rs, 1), "i") as (si, di):
                b.store(src.load(b, si), di, align=4)
    b.ret_void()
    return fn


def _pack_a_full(b, mr_max, kc, s, rs, cs, d, row_major, src):
    """A full panel: one vector store per k; a vector load when A's columns are contiguous,
    and for row-major A (power-of-two MR) square blocks of MR k-steps transposed in registers
    (`_transpose`)."""
    vty = u.vec(u.f32, mr_max)
    with b.if_else(b.icmp_signed("==", rs, u.const(1))) as (contiguous, strided):
        with contiguous, _stepping(b, kc, (s, d), (cs, mr_max)) as (sk, dk):
            b.store(src.load(b, sk, mr_max), u.vptr(b, dk, mr_max), align=4)
        with strided:
            rows = [u.gep(b, s, b.mul(u.const(i), rs)) for i in range(mr_max)]
            k_done = u.const(0)
            if row_major and mr_max & (mr_max - 1) == 0:
                k_blocks = b.select(b.icmp_signed("==", cs, u.const(1)),
                                    b.mul(b.sdiv(kc, u.const(mr_max)), u.const(mr_max)),
                                    u.const(0))
                with u.for_range(b, u.const(0), k_blocks, mr_max, "kt") as kt:
                    block = _transpose(b, [src.load(b, u.gep(b, row, kt), mr_max)
                                           for row in rows])
                    for t, col in enumerate(block):  # k-step kt + t: the panel's mr rows
                        at = u.gep(b, d, b.mul(b.add(kt, u.const(t)), u.const(mr_max)))
                        b.store(col, u.vptr(b, at, mr_max), align=4)
                k_done = k_blocks
            with u.for_range(b, k_done, kc, 1, "k") as k:
                off = b.mul(k, cs)
                val = ir.Constant(vty, None)
                for i, row in enumerate(rows):
                    x = src.load(b, u.gep(b, row, off))
                    val = b.insert_element(val, x, u.const(i, u.i32))
                b.store(val, u.vptr(b, u.gep(b, d, b.mul(k, u.const(mr_max))), mr_max),
                        align=4)


def emit_pack_b(module: ir.Module, nr_max: int, lanes: int, name: str = "tf_pack_b",
                src: Source = F32) -> ir.Function:
    """pack_b(kc, nc, B, rsb, csb, dst): B[kc, nc] -> NR-column panels, vector-padded."""
    fn, b = _new(module, name, ("kc", "nc", "src", "rs", "cs", "dst"), src)
    kc, nc, bsrc, rs, cs, dst = fn.args
    with b.if_else(b.icmp_signed("==", cs, u.const(1))) as (rows, strided):
        with rows:
            _pack_b_rows(b, nr_max, lanes, kc, nc, bsrc, rs, dst, src)
        with strided, u.for_range(b, u.const(0), nc, nr_max, "jr") as jr:
            nr = u.smin(b, u.const(nr_max), b.sub(nc, jr))
            w = b.mul(b.sdiv(b.add(nr, u.const(lanes - 1)), u.const(lanes)), u.const(lanes))
            d = u.gep(b, dst, b.mul(jr, kc))
            s = u.gep(b, bsrc, b.mul(jr, cs))
            k_done = u.const(0)
            if nr_max % lanes == 0 and lanes & (lanes - 1) == 0:
                # a full panel of B's transpose (columns contiguous along k: a weight W[n, k]
                # read as W.T): square blocks transposed in registers
                columns = b.and_(b.icmp_signed("==", rs, u.const(1)),
                                 b.icmp_signed("==", nr, u.const(nr_max)))
                k_done = b.select(columns, b.mul(b.sdiv(kc, u.const(lanes)), u.const(lanes)),
                                  u.const(0))
                _pack_b_columns(b, nr_max, lanes, k_done, s, cs, d, src)
            with u.for_range(b, u.const(0), nr, 1, "j") as j, \
                    _stepping(b, b.sub(kc, k_done),
                              (u.gep(b, s, b.add(b.mul(j, cs), b.mul(k_done, rs))),
                               u.gep(b, d, b.add(j, b.mul(k_done, w)))),
                              (rs, w)) as (sk, dk):
                b.store(src.load(b, sk), dk, align=4)
            zero = ir.Constant(u.f32, 0.0)
            with u.for_range(b, nr, w, 1, "jpad") as j, \
                    _stepping(b, kc, (u.gep(b, d, j),), (w,)) as (dk,):
                b.store(zero, dk, align=4)
    b.ret_void()
    return fn


def _pack_b_columns(b, nr_max, lanes, k_blocks, s, cs, d, src):
    """The first `k_blocks` k-steps (a multiple of `lanes`) of a full panel whose columns are
    contiguous along k (column j at `s + j * cs`): square blocks of `lanes` columns by `lanes`
    k-steps are loaded a vector per column, transposed in registers (`_transpose`) and stored
    a vector per k. Element by element, packing a transposed weight cost the forward linears
    of a training step 4-8% of their GEMM time (znver4)."""
    columns = [u.gep(b, s, b.mul(u.const(j), cs)) for j in range(nr_max)]
    with u.for_range(b, u.const(0), k_blocks, lanes, "kt") as kt:
        for g in range(nr_max // lanes):
            rows = _transpose(b, [src.load(b, u.gep(b, col, kt), lanes)
                                  for col in columns[g * lanes:(g + 1) * lanes]])
            for t, row in enumerate(rows):
                at = u.gep(b, d, b.add(b.mul(b.add(kt, u.const(t)), u.const(nr_max)),
                                       u.const(g * lanes)))
                b.store(row, u.vptr(b, at, lanes), align=4)


def _transpose(b, rows: list[ir.Value]) -> list[ir.Value]:
    """The transpose of a square block held as `n` vectors of `n` lanes (n a power of two):
    log2(n) stages, each exchanging the off-diagonal halves of every block of rows i and i + h
    (h = n/2, then n/4, ... 1), two shuffles per pair: 64 two-input shuffles for 16 x 16."""
    n = len(rows)
    h = n // 2
    while h:
        lo = [base + t for c in range(0, n, 2 * h) for base in (c, n + c) for t in range(h)]
        lo_mask = ir.Constant(u.vec(u.i32, n), lo)
        hi_mask = ir.Constant(u.vec(u.i32, n), [m + h for m in lo])
        out = list(rows)
        for i in (i for i in range(n) if i // h % 2 == 0):
            out[i] = b.shuffle_vector(rows[i], rows[i + h], lo_mask)
            out[i + h] = b.shuffle_vector(rows[i], rows[i + h], hi_mask)
        rows = out
        h //= 2
    return rows


def _pack_b_rows(b, nr_max, lanes, kc, nc, bsrc, rs, dst, src):
    """Contiguous rows, in bands of `BAND_ROWS` rows (then the last rows one by one): a band is
    walked panel by panel, so each of its rows is read front to back (a few sequential
    streams the hardware prefetcher follows) while each panel gets `BAND_ROWS` k-steps written
    together (row by row, a row's vectors landed in every panel: a page per panel per row,
    which ran at a quarter of a plain copy's speed)."""
    n_full = b.mul(b.sdiv(nc, u.const(nr_max)), u.const(nr_max))
    rest = b.sub(nc, n_full)
    w = b.mul(b.sdiv(b.add(rest, u.const(lanes - 1)), u.const(lanes)), u.const(lanes))
    bands = b.sdiv(kc, u.const(BAND_ROWS))
    band_rows = b.mul(bands, u.const(BAND_ROWS))
    cols = (n_full, rest, w)
    tail = u.gep(b, dst, b.mul(n_full, kc))
    steps = (b.mul(rs, u.const(BAND_ROWS)), nr_max * BAND_ROWS, b.mul(w, u.const(BAND_ROWS)))
    with _stepping(b, bands, (bsrc, dst, tail), steps, "kb") as ptrs:
        _pack_b_band(b, nr_max, lanes, BAND_ROWS, kc, rs, cols, ptrs, src)
    rows_done = (u.gep(b, bsrc, b.mul(band_rows, rs)),
                 u.gep(b, dst, b.mul(band_rows, u.const(nr_max))),
                 u.gep(b, tail, b.mul(band_rows, w)))
    with _stepping(b, b.sub(kc, band_rows), rows_done, (rs, nr_max, w)) as ptrs:
        _pack_b_band(b, nr_max, lanes, 1, kc, rs, cols, ptrs, src)


BAND_ROWS = 8  # rows of B per band of contiguous-row packing


def _pack_b_band(b, nr_max, lanes, rows, kc, rs, cols, ptrs, src):
    """`rows` consecutive rows of B (from `sk`) into every full panel (from `dk0`, `nr_max`
    floats per k) and the narrow last one (from `dk`, `w` per k)."""
    n_full, rest, w = cols
    sk, dk0, dk = ptrs
    srows = [sk if r == 0 else u.gep(b, sk, b.mul(rs, u.const(r))) for r in range(rows)]
    panels = b.sdiv(n_full, u.const(nr_max))
    panel_floats = b.mul(kc, u.const(nr_max))
    with _stepping(b, panels, (*srows, dk0), (nr_max,) * rows + (panel_floats,), "jr") as p:
        for r in range(rows):
            for v in range(nr_max // lanes):
                x = src.load(b, u.gep(b, p[r], v * lanes), lanes)
                b.store(x, u.vptr(b, u.gep(b, p[rows], r * nr_max + v * lanes), lanes),
                        align=4)
    nv = b.sdiv(w, u.const(lanes))
    with u.for_range(b, u.const(0), nv, 1, "v") as v:
        j = b.mul(v, u.const(lanes))
        mask = u.lane_mask(b, b.sub(rest, j), lanes)
        for r in range(rows):
            x = src.masked_load(b, u.gep(b, srows[r], b.add(n_full, j)), mask, lanes)
            b.store(x, u.vptr(b, u.gep(b, dk, b.add(b.mul(w, u.const(r)), j)), lanes),
                    align=4)
