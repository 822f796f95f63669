"""AMX tile instructions for the IR builder: one 16 x 64-byte tile shape, tiles named by number,
as the instructions themselves (`Tiles`) or as plain vector code with the same meaning
(`EmulatedTiles`), so the driver around the tiles is tested on hosts without AMX.

The non-`.internal` LLVM intrinsics take immediate tile numbers, so the generator allocates the
eight tiles itself and loads one configuration (palette 1, every tile 16 rows of 64 bytes) per
thread with `ldtilecfg` before the first tile instruction and `tilerelease` after the last.
Nothing may be called in between: tiles are not preserved across calls.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen.llvm import util as u
from tilefold.codegen.llvm.lowp.dot import dpbf16_fma, quad_dot

TILE_ROWS = 16
TILE_BYTES = 64  # bytes per tile row: 16 32-bit words (k-groups or accumulators)
TILE_WORDS = TILE_BYTES // 4
TILE_SIZE = TILE_ROWS * TILE_BYTES
_P8 = u.i8.as_pointer()
# The tile product instructions: (accumulator tile, A tile, B tile) -> acc += A . B.
DOTS = ("tdpbf16ps", "tdpbusd", "tdpbssd")


def _config_bytes() -> bytes:
    """palette 1; colsb (u16) of tiles 0-7 at bytes 16-31; rows (u8) of tiles 0-7 at 48-55."""
    config = bytearray(64)
    config[0] = 1
    for t in range(8):
        config[16 + 2 * t] = TILE_BYTES
        config[48 + t] = TILE_ROWS
    return bytes(config)


def _i64(x: ir.Value | int) -> ir.Value:
    return x if isinstance(x, ir.Value) else u.const(x)


def _check(instruction: str) -> None:
    if instruction not in DOTS:
        raise ValueError(f"{instruction!r} is not an AMX dot instruction ({', '.join(DOTS)})")


def _tile(t: int) -> ir.Constant:
    return ir.Constant(u.i8, t)


class Tiles:
    """The tile instructions, emitted with builder `b`."""

    def __init__(self, b: ir.IRBuilder):
        self.b = b

    def configure(self) -> None:
        """`ldtilecfg` of the module's (once-defined) 64-byte configuration."""
        module = self.b.module
        name = "tf_amx_tilecfg"
        if name in module.globals:
            cfg = module.globals[name]
        else:
            ty = ir.ArrayType(u.i8, 64)
            cfg = ir.GlobalVariable(module, ty, name)
            cfg.global_constant = True
            cfg.linkage = "internal"
            cfg.align = 64
            cfg.initializer = ir.Constant(ty, bytearray(_config_bytes()))
        self._call("ldtilecfg", [_P8], [self.b.bitcast(cfg, _P8)])

    def release(self) -> None:
        self._call("tilerelease", [], [])

    def zero(self, tile: int) -> None:
        self._call("tilezero", [u.i8], [_tile(tile)])

    def load(self, tile: int, ptr: ir.Value, stride_bytes: ir.Value | int) -> None:
        """Tile `tile` <- 16 rows of 64 bytes, `stride_bytes` apart, from `ptr`."""
        self._call("tileloadd64", [u.i8, _P8, u.i64], [_tile(tile), self.b.bitcast(ptr, _P8),
                                                       _i64(stride_bytes)])

    def store(self, tile: int, ptr: ir.Value, stride_bytes: ir.Value | int) -> None:
        self._call("tilestored64", [u.i8, _P8, u.i64], [_tile(tile), self.b.bitcast(ptr, _P8),
                                                        _i64(stride_bytes)])

    def dot(self, instruction: str, acc: int, a: int, bt: int) -> None:
        """acc += a . bt with `instruction` (one of DOTS); B is in k-group (VNNI) rows."""
        _check(instruction)
        self._call(instruction, [u.i8] * 3, [_tile(acc), _tile(a), _tile(bt)])

    def _call(self, name: str, types: list[ir.Type], args: list[ir.Value]) -> None:
        self.b.call(u.intrinsic(self.b.module, f"llvm.x86.{name}", u.void, types), args)


class EmulatedTiles(Tiles):
    """The same instructions as vector code over eight 1 KiB tiles on the stack: slow, but it
    runs on any x86-64 host and computes what the tile unit does (bf16 pair products are exact
    in f32; 8-bit quads are summed exactly in i32). Construct it in the function's entry block.
    """

    def __init__(self, b: ir.IRBuilder):
        super().__init__(b)
        storage = b.alloca(ir.ArrayType(u.i8, 8 * TILE_SIZE), name="tiles")
        storage.align = 64
        self.storage = b.bitcast(storage, _P8)

    def _row(self, tile: int, row: ir.Value | int, ty: ir.Type) -> ir.Value:
        """Pointer to row `row` of tile `tile` as 16 lanes of `ty`."""
        offset = self.b.add(u.const(tile * TILE_SIZE), self.b.mul(_i64(row), u.const(TILE_BYTES)))
        ptr = u.gep(self.b, self.storage, offset)
        return self.b.bitcast(ptr, u.vec(ty, TILE_WORDS).as_pointer())

    def configure(self) -> None:
        pass

    def release(self) -> None:
        pass

    def zero(self, tile: int) -> None:
        for r in range(TILE_ROWS):
            self.b.store(u.zeros(u.vec(u.i32, TILE_WORDS)), self._row(tile, r, u.i32), align=64)

    def _copy(self, ptr, stride_bytes, tile: int, into_tile: bool) -> None:
        b = self.b
        ty = u.vec(u.i32, TILE_WORDS)
        with u.for_range(b, u.const(0), u.const(TILE_ROWS), 1, "trow") as r:
            mem = b.bitcast(u.gep(b, b.bitcast(ptr, _P8), b.mul(r, _i64(stride_bytes))),
                            ty.as_pointer())
            row = self._row(tile, r, u.i32)
            src, dst = (mem, row) if into_tile else (row, mem)
            b.store(b.load(src, align=1), dst, align=1)

    def load(self, tile: int, ptr: ir.Value, stride_bytes: ir.Value | int) -> None:
        self._copy(ptr, stride_bytes, tile, into_tile=True)

    def store(self, tile: int, ptr: ir.Value, stride_bytes: ir.Value | int) -> None:
        self._copy(ptr, stride_bytes, tile, into_tile=False)

    def dot(self, instruction: str, acc: int, a: int, bt: int) -> None:
        """For each row m: C[m] += sum over words w of A[m][w] (broadcast) . B[w]."""
        _check(instruction)
        b = self.b
        floats = instruction == "tdpbf16ps"
        ty = u.f32 if floats else u.i32
        with u.for_range(b, u.const(0), u.const(TILE_ROWS), 1, "trow") as m:
            c_row = self._row(acc, m, ty)
            total = b.load(c_row, align=64)
            a_words = b.load(self._row(a, m, u.i32), align=64)
            for w in range(TILE_WORDS):
                a_word = u.lane_splat(b, a_words, w)
                b_row = b.load(self._row(bt, w, u.i32), align=64)
                total = (dpbf16_fma(b, total, a_word, b_row) if floats else
                         quad_dot(b, total, a_word, b_row, instruction == "tdpbssd"))
            b.store(total, c_row, align=64)
