"""Running weight-only matmuls: a weight's stream layout per target, and prepared calls.

`prepare(qt, m, ...)` returns a call whose `run(x, y)` takes NumPy arrays (x[M, K] with the
planned strides, y[M, N] with the planned row stride): for up to `GEMM_ROWS` rows a
`WeightOnlyCall`, one native call (the GEMV/skinny GEMM: copying and summing x, choosing tiles,
decoding, all native), so a compiled plan can replay it; for more rows an `UnpackedGemm`, two
(the weight decoded into shared f32 GEMM panels, then the f32 GEMM on them).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import ClassVar

import numpy as np

from tilefold.codegen.llvm.gemm.abi import DATA_OFFSET, NativePlan, compiled_entries
from tilefold.codegen.llvm.gemm.module import GemmModule, gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.lowp.decode import Decoder, choose_decoder
from tilefold.codegen.llvm.lowp.wgemv import (
    ENTRY,
    WgemvSpec,
    WParam,
    rows_per_pass,
    wgemv_ir,
    workspace,
)
from tilefold.codegen.llvm.lowp.wlayout import QuantizedWeight, StreamLayout
from tilefold.codegen.llvm.lowp.wunpack import ENTRY as UNPACK_ENTRY
from tilefold.codegen.llvm.lowp.wunpack import UnpackSpec, UParam, wunpack_ir
from tilefold.codegen.llvm.lowp.wvnni import BLOCK, wvnni_ir
from tilefold.codegen.llvm.lowp.wvnni import rows_per_pass as dot_rows_per_pass
from tilefold.errors import ShapeError
from tilefold.runtime import num_threads
from tilefold.runtime.replay import EXCLUSIVE, NativeCall
from tilefold.target import Target, host_target

# Below this many weight bytes a second thread costs more than it saves.
PARALLEL_MIN_BYTES = 1 << 16


def layout_kind(code: str, corrected: bool, target: Target) -> tuple[int, Decoder]:
    """The vector width and decoder of `target`'s stream layout of `code` codes (`corrected`:
    with zero points or offsets)."""
    return 16 if target.has("avx512f") else 8, choose_decoder(code, target, corrected)


def stream_layout(qt: QuantizedWeight, target: Target, codes: np.ndarray | None = None
                  ) -> StreamLayout:
    """The weight's stream layout for `target`'s vectors and decoder, built once and kept on the
    QuantizedTensor; `codes` are its codes one per element where the caller holds them (else
    unpacked from `qt`)."""
    corrected = qt.zero_point is not None or qt.offset is not None
    lanes, decoder = layout_kind(qt.code.name, corrected, target)
    key = ("stream", lanes, decoder)
    layout = qt.kernel_layouts.get(key)
    if layout is None:
        layout = qt.kernel_layouts[key] = StreamLayout(qt, lanes, decoder, num_threads(), codes)
    return layout


class WeightOnlyCall:
    """y = x @ W for M rows with fixed strides: `run(x, y)` is one native call."""

    def __init__(self, layout: StreamLayout, m: int, ldx: int, sxk: int, ldy: int,
                 target: Target, threads: int, dot: bool = False):
        self.layout = layout
        passes = dot_rows_per_pass if dot else rows_per_pass
        mt = min(m, passes(layout.lanes, layout.panels_per_tile), 8)
        spec = WgemvSpec(layout.decoder, layout.lanes, layout.panels_per_tile, layout.group, mt,
                         layout.f16_scales, layout.corrected,
                         dot_instruction(layout.lanes, target) if dot else "")
        threads = max(1, min(threads, layout.tiles))
        values = {WParam.M: m, WParam.K: layout.k, WParam.LDX: ldx, WParam.SXK: sxk,
                  WParam.LDY: ldy, WParam.N: layout.n, WParam.TILES: layout.tiles,
                  WParam.GROUPS: layout.groups, WParam.CHUNK: layout.chunk_bytes,
                  WParam.THREADS: threads,
                  WParam.DATA_OFFSET: DATA_OFFSET,
                  **workspace(spec, m, layout.k, layout.groups)}
        generator = wvnni_ir if dot else wgemv_ir
        self.plan = NativePlan(compiled_entries(target, spec.name, ENTRY, generator, spec, target),
                               WParam, values)
        self.plan.ws_bytes = values[WParam.WS_STRIDE] * threads
        self.data = layout.data

    def run(self, x: np.ndarray, y: np.ndarray) -> None:
        """y[:M, :N] = x @ W (the caller guarantees the planned shapes, strides and dtypes)."""
        self.plan.run(x, self.data, y)

    def calls(self, x: np.ndarray, y: np.ndarray) -> list[NativeCall] | None:
        """`run(x, y)` as native calls to replay, or None where it cannot be replayed."""
        call = self.plan.call(x, self.data, y)
        return None if call is None else [call]


# From this many rows of x, decoding the weight once into f32 GEMM panels and running the f32
# GEMM beats the GEMV's passes of a few rows (each decoding the weight again).
GEMM_ROWS = 32


# A weight whose f32 panels exceed L3 / SLICE_FROM (a model's head) is decoded and multiplied a
# slice of N at a time, each slice's panels at most L3 / SLICE_L3_SHARE, so that they are still
# in cache when the GEMM reads them instead of going to DRAM and back (SmolLM2's head, 576 x
# 49152, M = 256: 193 -> 206 GFLOP/s at 2 threads, 96 -> 103 at 1; smaller shares or slicing
# weights that fit measured no faster).
SLICE_FROM = 4
SLICE_L3_SHARE = 8


def slice_tiles(layout: StreamLayout, target: Target) -> int:
    """Tiles of the weight per slice of N (all of them where its f32 panels fit L3's share)."""
    per_tile = 4 * layout.k * layout.tile_width
    if per_tile * layout.tiles <= target.l3_bytes // SLICE_FROM:
        return layout.tiles
    return max(1, min(layout.tiles, target.l3_bytes // SLICE_L3_SHARE // per_tile))


class UnpackedGemm:
    """y = x @ W for many rows: W decoded into the f32 GEMM's pre-packed panels (a buffer
    shared by every weight of this slice shape), then the f32 GEMM on them, slice by slice of N
    (`slice_tiles`): two native calls a slice, made under a lock since the panels are shared."""

    _panels: ClassVar[dict[tuple, PackedMatrix]] = {}
    _lock = threading.Lock()

    def __init__(self, layout: StreamLayout, m: int, ldx: int, sxk: int, ldy: int,
                 target: Target, threads: int):
        module = gemm_module(target)
        self.layout = layout
        nr = module.kernel.nr
        spec = UnpackSpec(layout.decoder, layout.lanes, layout.panels_per_tile, layout.group,
                          layout.f16_scales, layout.corrected, nr)
        entries = compiled_entries(target, spec.name, UNPACK_ENTRY, wunpack_ir, spec, target)
        a = _probe((m, layout.k), (ldx, sxk))
        per = slice_tiles(layout, target)
        self.slices = []  # (first column, columns, unpack plan, panels, GEMM plan, data)
        for t0 in range(0, layout.tiles, per):
            tiles = min(per, layout.tiles - t0)
            n0 = t0 * layout.tile_width
            n = min(layout.n - n0, tiles * layout.tile_width)
            panels = self._shared(layout.k, n, module)
            n_full = n // nr * nr
            w_last = -(-(n - n_full) // module.kernel.lanes) * module.kernel.lanes
            values = {UParam.K: layout.k, UParam.N: n, UParam.TILES: tiles,
                      UParam.GROUPS: layout.groups, UParam.CHUNK: layout.chunk_bytes,
                      UParam.NFULL: n_full, UParam.WLAST: w_last,
                      UParam.THREADS: max(1, min(threads, tiles)),
                      UParam.DATA_OFFSET: DATA_OFFSET}
            gemm = make_plan(module, a, panels, _probe((m, n), (ldy, 1)), 0, threads)
            self.slices.append((n0, n, NativePlan(entries, UParam, values), panels, gemm,
                                layout.data[t0 * layout.tile_bytes:]))
        self.data = layout.data

    @classmethod
    def _shared(cls, k: int, n: int, module: GemmModule) -> PackedMatrix:
        key = (k, n, module.target, module.kernel.name)
        with cls._lock:
            if key not in cls._panels:
                cls._panels[key] = PackedMatrix.unfilled((k, n), module)
            return cls._panels[key]

    def run(self, x: np.ndarray, y: np.ndarray) -> None:
        with self._lock:
            for n0, n, unpack, panels, gemm, data in self.slices:
                unpack.run(data, panels.data, panels.data)
                gemm(x, panels.data, y[..., n0:n0 + n])

    def calls(self, x: np.ndarray, y: np.ndarray) -> list[NativeCall] | None:
        """None in this process: the panels are shared by every weight of this shape, so each
        run holds a lock that a replayed sequence of calls would not. Under `exclusive_replay`
        (a step recorded for an artifact, whose calls run one sequence at a time) each slice's
        unpack and GEMM, the panels a workspace the unpack fills."""
        if not EXCLUSIVE.get():
            return None
        calls: list[NativeCall] = []
        for n0, n, unpack, panels, gemm, data in self.slices:
            fill = unpack.call(data, panels.data, panels.data)
            multiply = gemm.call(x, panels.data, y[..., n0:n0 + n])
            if fill is None or multiply is None:
                return None
            calls += [replace(fill, scratch=(*fill.scratch, panels.data)), multiply]
        return calls


def _probe(shape: tuple[int, int], strides: tuple[int, int]) -> np.ndarray:
    """An f32 array of `shape` and element `strides` for planning (never read)."""
    return np.lib.stride_tricks.as_strided(np.empty(1, np.float32), shape,
                                           tuple(4 * s for s in strides))


def dot_instruction(lanes: int, target: Target) -> str | None:
    """The integer dot a `lanes`-wide kernel uses on `target`: "vnni" (`vpdpbusd`), else
    "maddubs" (`pmaddubsw` + `pmaddwd`, AVX2 or AVX512BW), else None."""
    if lanes == 16:
        vnni, maddubs = target.has("avx512vnni"), target.has("avx512bw")
    else:
        vnni = target.has("avxvnni") or target.has("avx512vnni", "avx512vl")
        maddubs = target.has("avx2")
    return "vnni" if vnni else "maddubs" if maddubs else None


def dot_refusal(layout: StreamLayout, target: Target) -> str | None:
    """Why the integer-dot kernel cannot run this weight on `target`, or None."""
    if dot_instruction(layout.lanes, target) is None:
        return f"{target.name} has no integer dot product (VNNI, or AVX2 / AVX512BW pmaddubsw)"
    if layout.decoder.code not in ("i4", "i8", "u8"):
        return f"the integer dot takes integer codes, not {layout.decoder.code}"
    if layout.group % BLOCK:
        return f"activations are quantized per {BLOCK} k: the weight's group {layout.group} " \
               f"is not a multiple"
    return None


def default_threads(layout: StreamLayout) -> int:
    return num_threads() if layout.data.nbytes >= PARALLEL_MIN_BYTES else 1


def prepare(qt: QuantizedWeight, m: int, ldx: int, sxk: int = 1, ldy: int | None = None,
            target: Target | None = None, threads: int | None = None,
            dot: bool = False) -> WeightOnlyCall | UnpackedGemm:
    """The call for M rows of x (row stride `ldx`, column stride `sxk`, in elements) into y
    with row stride `ldy` (default N), on at most `threads` threads (a GEMV of a small weight
    takes one); `dot`: int8 activations and the integer dot product (see `dot_refusal`)."""
    target = target or host_target()
    return prepare_layout(stream_layout(qt, target), m, ldx, sxk, ldy, target, threads, dot)


def prepare_layout(layout: StreamLayout, m: int, ldx: int, sxk: int = 1, ldy: int | None = None,
                   target: Target | None = None, threads: int | None = None,
                   dot: bool = False) -> WeightOnlyCall | UnpackedGemm:
    """`prepare` on a stream layout already made (`stream_layout`) for `target`."""
    target = target or host_target()
    ldy = layout.n if ldy is None else ldy
    threads = num_threads() if threads is None else threads
    if m >= GEMM_ROWS and not dot:
        return UnpackedGemm(layout, m, ldx, sxk, ldy, target, threads)
    return WeightOnlyCall(layout, m, ldx, sxk, ldy, target,
                          min(threads, default_threads(layout)), dot)


_MAX_CALLS = 64  # kept per weight; a serving loop meets few distinct M


def weight_only_matmul(x: np.ndarray, qt: QuantizedWeight, target: Target | None = None,
                       threads: int | None = None) -> np.ndarray:
    """x[M, K] (f32, any strides) @ dequantize(qt) -> f32[M, N], decoding in registers.

    Calls are kept on the weight per (M, strides, target, threads)."""
    target = target or host_target()
    if x.ndim != 2 or x.dtype != np.float32:
        raise ShapeError(f"weight_only_matmul: x must be f32[M, K], got {x.dtype}{list(x.shape)}")
    layout = stream_layout(qt, target)
    m = x.shape[0]
    y = np.empty((m, layout.n), np.float32)
    if m == 0 or layout.n == 0:
        return y
    if layout.k == 0:
        y[...] = 0
        return y
    ldx, sxk = (s // 4 for s in x.strides)
    key = ("call", m, ldx, sxk, target, threads)
    call = qt.kernel_layouts.get(key)
    if call is None:
        if len(qt.kernel_layouts) >= _MAX_CALLS:
            for old in [k for k in qt.kernel_layouts if k[0] == "call"]:
                del qt.kernel_layouts[old]
        call = qt.kernel_layouts[key] = prepare(qt, m, ldx, sxk, None, target, threads)
    call.run(x, y)
    return y
