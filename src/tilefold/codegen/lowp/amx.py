"""AMX tile instructions for the IR builder: one 16 x 64-byte tile shape, tiles named by number.

The non-`.internal` LLVM intrinsics take immediate tile numbers, so the generator allocates the
eight tiles itself and loads one configuration (palette 1, every tile 16 rows of 64 bytes) per
thread with `ldtilecfg` before the first tile instruction and `tilerelease` after the last.
Nothing may be called in between: tiles are not preserved across calls.
"""

from __future__ import annotations

from llvmlite import ir

from tilefold.codegen import llvm_util as u

TILE_ROWS = 16
TILE_BYTES = 64  # bytes per tile row: 16 32-bit words (k-groups or accumulators)
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


def load_config(b: ir.IRBuilder) -> None:
    """`ldtilecfg` of the module's (once-defined) 64-byte configuration."""
    module = b.module
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
    _call(b, "ldtilecfg", [_P8], [b.bitcast(cfg, _P8)])


def release(b: ir.IRBuilder) -> None:
    _call(b, "tilerelease", [], [])


def zero(b: ir.IRBuilder, tile: int) -> None:
    _call(b, "tilezero", [u.i8], [_tile(tile)])


def load(b: ir.IRBuilder, tile: int, ptr: ir.Value, stride_bytes: ir.Value | int) -> None:
    """Tile `tile` <- 16 rows of 64 bytes, `stride_bytes` apart, from `ptr`."""
    _call(b, "tileloadd64", [u.i8, _P8, u.i64], [_tile(tile), b.bitcast(ptr, _P8),
                                                 _i64(stride_bytes)])


def store(b: ir.IRBuilder, tile: int, ptr: ir.Value, stride_bytes: ir.Value | int) -> None:
    _call(b, "tilestored64", [u.i8, _P8, u.i64], [_tile(tile), b.bitcast(ptr, _P8),
                                                  _i64(stride_bytes)])


def dot(b: ir.IRBuilder, instruction: str, acc: int, a: int, bt: int) -> None:
    """acc += a . bt with `instruction` (one of DOTS); B is in k-group (VNNI) rows."""
    if instruction not in DOTS:
        raise ValueError(f"{instruction!r} is not an AMX dot instruction ({', '.join(DOTS)})")
    _call(b, instruction, [u.i8] * 3, [_tile(acc), _tile(a), _tile(bt)])


def _tile(t: int) -> ir.Constant:
    return ir.Constant(u.i8, t)


def _i64(x: ir.Value | int) -> ir.Value:
    return x if isinstance(x, ir.Value) else u.const(x)


def _call(b: ir.IRBuilder, name: str, types: list[ir.Type], args: list[ir.Value]) -> None:
    b.call(u.intrinsic(b.module, f"llvm.x86.{name}", u.void, types), args)
