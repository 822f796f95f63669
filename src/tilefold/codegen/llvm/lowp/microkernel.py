"""Low-precision micro-kernels: one MR x NR block of C over one K block, for each kind of registry
row — AMX tiles (two 16 x 16 accumulator tiles side by side) and register tiles of dot steps.

The driver (`tilefold.codegen.llvm.lowp.driver`) is the same for every row; what it hands a
micro-kernel is laid out by `tilefold.codegen.llvm.lowp.packgen`:

    A panel  MR rows as chunks of 16 k-group words: chunk kt at apan + kt * MR * 64 bytes,
             row i's 16 words at + i * 64 (with MR = 16 a chunk is one AMX tile)
    B panel  one row of NR words per k-group word (VNNI order): word w at bpan + w * NR * 4
    C        (pointer, row stride in bytes) to read the partial sums from (unless `first`) and
             to write the block's new sums to, NR 32-bit words a row
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.lowp.amx import TILE_BYTES, TILE_SIZE, EmulatedTiles, Tiles
from tilefold.codegen.llvm.lowp.dot import DOT_STEPS
from tilefold.codegen.llvm.lowp.kernels import CHUNK_WORDS, DotKernel

CPointer = tuple[ir.Value, ir.Value]  # (byte pointer, row stride in bytes)


class MicroKernel:
    """Emits the kernel's blocks with builder `b`: `begin` once per thread before the first
    block, `block` per block and K block, `end` after the last."""

    def __init__(self, b: ir.IRBuilder, kernel: DotKernel):
        self.b, self.kernel = b, kernel

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass

    def block(self, apan: ir.Value, chunks: ir.Value, bpan: ir.Value, c_in: CPointer,
              c_out: CPointer, first: ir.Value) -> None:
        raise NotImplementedError


class TileBlock(MicroKernel):
    """AMX: each chunk step loads one A tile and two B tiles for two products. A 2 x 2 block
    (four accumulators, one load per product) uses all eight tiles, and on Emerald Rapids
    (shared cores) kernels touching more than five or six tiles lose throughput whenever the
    core is contended: measured 1x2 vs 2x2 steps on L1 data, 870 vs 510 GFLOP/s contended and
    2040 vs 1650 uncontended (A streaming from L2: 740 vs 460, 1900 vs 1500)."""

    def __init__(self, b: ir.IRBuilder, kernel: DotKernel, emulate: bool = False):
        super().__init__(b, kernel)
        self.tiles = EmulatedTiles(b) if emulate else Tiles(b)

    def begin(self) -> None:
        self.tiles.configure()

    def end(self) -> None:
        self.tiles.release()

    def block(self, apan, chunks, bpan, c_in, c_out, first) -> None:
        b, tiles = self.b, self.tiles
        row_bytes = self.kernel.nr * 4
        halves = [lambda p: p, lambda p: u.gep(b, p, TILE_BYTES)]
        with b.if_else(first) as (fresh, partial):
            with fresh:
                for t in range(2):
                    tiles.zero(t)
            with partial:
                for t, at in enumerate(halves):
                    tiles.load(t, at(c_in[0]), c_in[1])
        with u.for_range(b, u.const(0), chunks, 1, "kt") as kt:
            b0 = u.gep(b, bpan, b.mul(kt, u.const(CHUNK_WORDS * row_bytes)))
            tiles.load(6, b0, row_bytes)
            tiles.load(7, u.gep(b, b0, TILE_BYTES), row_bytes)
            tiles.load(4, u.gep(b, apan, b.mul(kt, u.const(TILE_SIZE))), TILE_BYTES)
            tiles.dot(self.kernel.dot, 0, 4, 6)
            tiles.dot(self.kernel.dot, 1, 4, 7)
        for t, at in enumerate(halves):
            tiles.store(t, at(c_out[0]), c_out[1])


class DotBlock(MicroKernel):
    """Register tiles: MR x NV accumulator vectors; per k-group word, NV B vectors, MR A words
    broadcast, MR x NV dot steps (`DOT_STEPS[kernel.dot]`)."""

    def block(self, apan, chunks, bpan, c_in, c_out, first) -> None:
        b, k = self.b, self.kernel
        lanes, nv, mr = k.lanes, k.nv, k.mr
        wty = u.vec(u.i32, lanes)
        accty = u.vec(u.f32, lanes) if k.acc_is_float else wty
        step = DOT_STEPS[k.dot]

        def c_vector(c: CPointer, i: int, v: int) -> ir.Value:
            offset = b.add(b.mul(c[1], u.const(i)), u.const(v * lanes * 4))
            return b.bitcast(u.gep(b, c[0], offset), accty.as_pointer())

        zero = u.zeros(accty)
        start = [b.select(first, zero, b.load(c_vector(c_in, i, v), align=4))
                 for i in range(mr) for v in range(nv)]
        words_a = b.bitcast(apan, u.i32.as_pointer())
        words_b = b.bitcast(bpan, wty.as_pointer())
        # One k-group word an iteration (unrolling a chunk's 16 let the scheduler hoist loads
        # until accumulators spilled); row i's word w is at chunk w / 16, lane w % 16.
        words = b.mul(chunks, u.const(CHUNK_WORDS))
        with u.for_range_carry(b, u.const(0), words, 1, start, "kw") as loop:
            w = loop.index
            a0 = b.add(b.mul(b.lshr(w, u.const(4)), u.const(mr * CHUNK_WORDS)),
                       b.and_(w, u.const(CHUNK_WORDS - 1)))
            bv = [b.load(u.gep(b, words_b, b.add(b.mul(w, u.const(nv)), u.const(v))), align=4)
                  for v in range(nv)]
            acc = list(loop.values)
            for i in range(mr):
                aw = b.load(u.gep(b, words_a, b.add(a0, u.const(i * CHUNK_WORDS))), align=4)
                av = u.splat(b, aw, lanes)
                for v in range(nv):
                    acc[i * nv + v] = step(b, acc[i * nv + v], av, bv[v])
            loop.next = acc
        for i in range(mr):
            for v in range(nv):
                b.store(loop.result[i * nv + v], c_vector(c_out, i, v), align=4)


def micro_kernel(b: ir.IRBuilder, kernel: DotKernel, emulate: bool = False) -> MicroKernel:
    """The micro-kernel of `kernel`'s kind (`emulate`: AMX tiles as plain vector code)."""
    return TileBlock(b, kernel, emulate) if kernel.is_amx else DotBlock(b, kernel)
