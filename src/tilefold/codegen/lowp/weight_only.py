"""Running weight-only GEMV/skinny GEMM: kernel panel layouts of a quantized weight, plans."""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from tilefold.codegen.gemm.abi import DATA_OFFSET, NativePlan, compiled_entries
from tilefold.codegen.lowp.decode import choose_decoder, octet_packed, octet_x_scales
from tilefold.codegen.lowp.wgemv import ENTRY, WgemvSpec, WParam, wgemv_ir
from tilefold.errors import UnsupportedError
from tilefold.runtime import num_threads
from tilefold.target import Target, host_target

# Panels per tile by rows per pass: enough independent FMA chains (2 * mt * nv >= 8) to hide
# latency, few enough accumulators to stay in registers.
_TILES = ((1, 4), (2, 2), (4, 1), (8, 1))
PANEL_PAD = 4  # panels are padded to a multiple of the widest tile
# Below this many weight bytes a second thread costs more than it saves.
PARALLEL_MIN_BYTES = 1 << 18


class QuantizedWeight(Protocol):
    """What the kernels read of a `tilefold.quant.QuantizedTensor` (a layer above codegen)."""

    shape: tuple[int, ...]
    axis: int
    format: Any  # tilefold.quant.Format: .bits, .name
    scale: np.ndarray
    zero_point: np.ndarray | None
    kernel_layouts: dict[Any, Any]

    @property
    def code(self) -> Any: ...

    @property
    def group_size(self) -> int: ...

    def codes(self) -> np.ndarray: ...


def tile_for(m: int) -> tuple[int, int]:
    """(rows per pass, panels per tile) for M rows."""
    return next(t for t in _TILES if m <= t[0]) if m <= 8 else _TILES[-1]


class PanelLayout:
    """A [K, N] weight's codes in column panels of `lanes`, k-pairs interleaved per lane (or
    octets), plus scales and zero-point corrections as [panels, groups, lanes] f32 (panels
    padded), stored for `decoder` (codes plus its offset, x scaled by `x_scale` per k)."""

    def __init__(self, qt: QuantizedWeight, lanes: int, target: Target):
        codes = np.moveaxis(qt.codes(), qt.axis, 0)
        if codes.ndim != 2:
            raise UnsupportedError(
                f"weight-only matmul takes a 2-D weight, got shape {list(qt.shape)}; "
                "reshape it to [K, N] (or [N, K] with axis=1)")
        k, n = codes.shape
        group = qt.group_size
        if k % 2 or group % 2:
            raise UnsupportedError(
                f"weight-only kernels step k in pairs: K = {k} and group {group} must be even; "
                "quantize with an even group_size or pad K")
        self.k, self.n, self.group, self.lanes = k, n, group, lanes
        self.groups = k // group
        panels = math.ceil(n / lanes)
        self.panels = math.ceil(panels / PANEL_PAD) * PANEL_PAD
        npad = self.panels * lanes
        bits = codes.view(np.uint8)
        octets = octet_packed(lanes, group, qt.format.bits == 4)
        self.decoder = choose_decoder(qt.code.name, target, octets and qt.zero_point is None)
        if qt.format.bits == 4:
            bits = (bits + np.uint8(self.decoder.offset)) & 0x0F
        full = np.zeros((k, npad), np.uint8)
        full[:, :n] = bits
        pairs = full.reshape(k // 2, 2, self.panels, lanes)
        if octets:
            octets = full.reshape(k // 8, 8, self.panels, lanes).astype(np.uint32)
            words = sum(octets[:, j] << np.uint32(4 * j) for j in range(8))
            self.codes = np.ascontiguousarray(words.transpose(1, 0, 2)).view(np.uint8)
        elif qt.format.bits == 4:
            self.codes = np.ascontiguousarray(
                (pairs[:, 0] | (pairs[:, 1] << 4)).transpose(1, 0, 2))
        else:
            self.codes = np.ascontiguousarray(pairs.transpose(2, 0, 1, 3))
        self.scale = self._per_column(qt, qt.scale, 1.0)
        self.zcorr = None
        if qt.zero_point is not None or self.decoder.offset:
            zp = qt.zero_point if qt.zero_point is not None else self.decoder.offset
            zc = -np.asarray(zp, np.float64) * qt.scale.astype(np.float64)
            self.zcorr = self._per_column(qt, zc.astype(np.float32), 0.0)
        scales = octet_x_scales(self.decoder)
        self.x_scale = None if scales is None else np.tile(scales, k // 8)
        self.code = qt.code.name
        self.plans: dict[tuple, tuple[NativePlan, np.ndarray]] = {}  # see weight_only_matmul

    def _per_column(self, qt, values: np.ndarray, pad: float) -> np.ndarray:
        """[groups, N'] blockwise values -> [panels, groups, lanes]."""
        v = np.moveaxis(values, qt.axis, 0)
        v = np.repeat(v, self.n // v.shape[1], axis=1)
        full = np.full((self.groups, self.panels * self.lanes), pad, np.float32)
        full[:, :self.n] = v
        return np.ascontiguousarray(full.reshape(self.groups, self.panels, self.lanes)
                                    .transpose(1, 0, 2))


def panel_layout(qt: QuantizedWeight, target: Target) -> PanelLayout:
    """The weight's panel layout for `target`'s vectors and decoder, built once and kept on the
    QuantizedTensor."""
    wide = "avx512f" in target.features
    key = ("panels", wide)
    layout = qt.kernel_layouts.get(key)
    if layout is None:
        layout = qt.kernel_layouts[key] = PanelLayout(qt, 16 if wide else 8, target)
    return layout


def _plan(layout: PanelLayout, m: int, ldx: int, target: Target, threads: int,
          sx: np.ndarray) -> NativePlan:
    """The ready-to-run call for M rows of stride `ldx` (y is written with stride N')."""
    mt, nv = tile_for(m)
    spec = WgemvSpec(layout.decoder, layout.lanes, layout.group, mt, nv,
                     layout.zcorr is not None)
    units = layout.panels // nv
    zc = layout.zcorr if layout.zcorr is not None else layout.scale
    values = {WParam.M: m, WParam.K: layout.k, WParam.LDX: ldx,
              WParam.LDY: layout.panels * layout.lanes, WParam.UNITS: units,
              WParam.GROUPS: layout.groups, WParam.THREADS: max(1, min(threads, units)),
              WParam.SCALE: layout.scale.ctypes.data, WParam.ZCORR: zc.ctypes.data,
              WParam.SX: sx.ctypes.data, WParam.DATA_OFFSET: DATA_OFFSET}
    return NativePlan(compiled_entries(target, spec.name, ENTRY, wgemv_ir, spec, target), WParam,
                      values)


_NO_SX = np.zeros(1, np.float32)
_MAX_PLANS = 64  # per weight; a serving loop meets few distinct M


def weight_only_matmul(x: np.ndarray, qt: QuantizedWeight, target: Target | None = None,
                       threads: int | None = None) -> np.ndarray:
    """x[M, K] (f32, C-contiguous) @ dequantize(qt) -> f32[M, N], decoding in registers.

    Plans are kept on the layout per (M, row stride, target, threads), each with the buffer
    its zero-point correction reads this call's row sums of x from: building one costs ~15 us
    of Python, 4% of a 4096 x 4096 int4 GEMV."""
    target = target or host_target()
    layout = panel_layout(qt, target)
    m = x.shape[0]
    ldx = x.strides[0] // 4
    if threads is None:
        threads = num_threads() if layout.codes.nbytes >= PARALLEL_MIN_BYTES else 1
    y = np.empty((m, layout.panels * layout.lanes), np.float32)
    rows = x
    if layout.x_scale is not None:  # the decoder reads nibble j as u * 16**j
        x = np.multiply(x, layout.x_scale, dtype=np.float32)
        ldx = layout.k
    key = (m, ldx, target, threads)
    kept = layout.plans.get(key)
    if kept is None:
        if len(layout.plans) >= _MAX_PLANS:
            layout.plans.clear()
        sx = np.zeros((m, layout.groups), np.float32) if layout.zcorr is not None else _NO_SX
        kept = layout.plans[key] = (_plan(layout, m, ldx, target, threads, sx), sx)
    plan, sx = kept
    if layout.zcorr is not None:  # this call's row sums of x, where the plan reads them
        # (`np.add.reduce`, not `np.sum`: the same sums without the wrapper's 3-6 us)
        np.add.reduce(rows.reshape(m, layout.groups, layout.group), axis=2, out=sx)
    plan.run(x, layout.codes, y)
    return y[:, :layout.n]
