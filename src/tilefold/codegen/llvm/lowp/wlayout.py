"""The weight-only kernels' weight layout: each thread's columns as one stream of group chunks.

A [K, N] weight's columns are cut into tiles of P panels of L lanes (P * L columns). A tile is
stored as one run of *chunks*, one per group of K: the group's codes for the P panels in steps
(`decode.py`: per step and panel one word per lane, 8 nibbles or 4 bytes), then the group's
scales for the tile's columns (f16 where every scale is exactly an f16, as GGUF's are; else
f32), then its corrections (f32, where the weight has zero points or offsets: what a group adds
per unit of sum(x)), each chunk padded to a cache line. Tiles follow one another, so a thread
reads its columns front to back as one sequential stream, which the hardware prefetcher follows
(software prefetch on top of it measured no faster). Groups whose length is not a whole number
of steps are padded with zero codes (the kernels pad x with zeros there too).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from tilefold.codegen.llvm.lowp.decode import NIBBLE_STORE_OFFSET, Decoder, nibble_k
from tilefold.errors import UnsupportedError
from tilefold.runtime.numpy_threads import by_rows

TILE_PANELS = (4, 3, 2)  # panels per tile, the first that balances the threads best
CHUNK_ALIGN = 64


class QuantizedWeight(Protocol):
    """What the kernels read of a `tilefold.quant.QuantizedTensor` (a layer above codegen)."""

    shape: tuple[int, ...]
    axis: int
    format: Any  # tilefold.quant.Format: .bits, .name
    scale: np.ndarray
    zero_point: np.ndarray | None
    offset: np.ndarray | None
    kernel_layouts: dict[Any, Any]

    @property
    def code(self) -> Any: ...

    @property
    def group_size(self) -> int: ...

    def codes(self) -> np.ndarray: ...


def tile_panels(panels: int, threads: int) -> int:
    """Panels per tile for a weight of `panels` panels split over `threads` threads: the fewest
    panels on the busiest thread, then the widest tile (more independent chains per step)."""
    def busiest(p: int) -> int:
        return math.ceil(math.ceil(panels / p) / threads) * p
    return min(TILE_PANELS, key=lambda p: (busiest(p), -p))


class StreamLayout:
    """A weight's codes, scales and corrections in tile chunks for one decoder and vector width.

    `data` (uint8) holds the chunks: tile t, group g at byte (t * groups + g) * chunk_bytes."""

    def __init__(self, qt: QuantizedWeight, lanes: int, decoder: Decoder, threads: int,
                 codes: np.ndarray | None = None):
        codes = np.moveaxis(qt.codes() if codes is None else codes, qt.axis, 0)
        if codes.ndim != 2:
            raise UnsupportedError(
                f"weight-only matmul takes a 2-D weight, got shape {list(qt.shape)}; "
                "reshape it to [K, N] (or [N, K] with axis=1)")
        k, n = codes.shape
        group = qt.group_size
        self.k, self.n, self.group, self.lanes, self.decoder = k, n, group, lanes, decoder
        self.groups = k // group
        step = decoder.per_step
        self.steps = -(-group // step)  # steps per group
        self.group_padded = self.steps * step
        panels = max(1, -(-n // lanes))
        self.panels_per_tile = p = tile_panels(panels, threads)
        self.tiles = -(-panels // p)
        self.code_bytes = self.steps * 4 * p * lanes  # a word of 8 nibbles or 4 bytes a lane
        scale = self._per_column(qt, qt.scale)
        self.f16_scales = bool(np.array_equal(scale.astype(np.float16).astype(np.float32),
                                              scale))
        parts = [self._chunked(scale.astype(np.float16 if self.f16_scales else np.float32))]
        self.corrected = qt.zero_point is not None or qt.offset is not None
        if self.corrected:
            parts.append(self._chunked(_corrections(qt, self._per_column).astype(np.float32)))
        self.scale_bytes = parts[0].shape[2]
        used = self.code_bytes + sum(part.shape[2] for part in parts)
        self.chunk_bytes = -(-used // CHUNK_ALIGN) * CHUNK_ALIGN
        self.data = np.zeros((self.tiles, self.groups, self.chunk_bytes), np.uint8)
        # The codes a few tiles at a time (`by_rows`' pieces, on the process's threads), so that
        # a large weight (a vocabulary head) never has temporaries of its whole size beside it.
        def lay_out(t0: int, t1: int) -> None:
            columns = codes[:, t0 * p * lanes:t1 * p * lanes]
            self.data[t0:t1, :, :self.code_bytes] = self._code_chunk(
                _stored_codes(columns, qt, decoder), t1 - t0)

        by_rows(self.tiles, lay_out, row_elements=k * p * lanes)
        at = self.code_bytes
        for part in parts:
            self.data[:, :, at:at + part.shape[2]] = part
            at += part.shape[2]
        self.data = self.data.reshape(-1)

    def _code_chunk(self, stored: np.ndarray, tiles: int) -> np.ndarray:
        """Stored codes [K, n] of `tiles` tiles' columns as their bytes [tiles, groups,
        code_bytes] (columns past n and steps past a group's end padded with zero codes)."""
        g, s, p, lanes = self.groups, self.steps, self.panels_per_tile, self.lanes
        full = np.zeros((g, self.group_padded, tiles * p * lanes), np.uint8)
        full[:, :self.group, :stored.shape[1]] = stored.reshape(g, self.group, -1)
        if self.decoder.nibbles:  # a lane's little-endian word: byte m holds nibbles 2m, 2m + 1
            octets = full.reshape(g, s, 8, tiles, p, lanes)
            pairs = np.stack([octets[:, :, nibble_k(2 * m)]
                              | (octets[:, :, nibble_k(2 * m + 1)] << np.uint8(4))
                              for m in range(4)], axis=-1)  # [g, s, tiles, p, lanes, 4]
            return pairs.transpose(2, 0, 1, 3, 4, 5).reshape(tiles, g, -1)
        # a lane's word holds its column's bytes k0 .. k0 + 3 in order: the quads an integer dot
        # multiplies, so no kernel transposes codes in registers
        part = full.reshape(g, s, 4, tiles, p, lanes).transpose(3, 0, 1, 4, 5, 2)
        return part.reshape(tiles, g, -1)

    @property
    def tile_bytes(self) -> int:
        return self.groups * self.chunk_bytes

    @property
    def tile_width(self) -> int:
        return self.panels_per_tile * self.lanes

    def _per_column(self, qt: QuantizedWeight, values: np.ndarray) -> np.ndarray:
        """Blockwise values [groups', N'] as [groups, N] (repeated over the blocks they span)."""
        v = np.moveaxis(values, qt.axis, 0)
        return np.repeat(np.repeat(v, self.groups // v.shape[0], axis=0),
                         self.n // v.shape[1], axis=1)

    def _chunked(self, per_column: np.ndarray) -> np.ndarray:
        """[groups, N] -> bytes [tiles, groups, P * L * itemsize] (columns padded with zeros)."""
        width = self.tiles * self.tile_width
        full = np.zeros((self.groups, width), per_column.dtype)
        full[:, :self.n] = per_column
        tiled = full.reshape(self.groups, self.tiles, self.tile_width).transpose(1, 0, 2)
        return np.ascontiguousarray(tiled).view(np.uint8)


def _stored_codes(codes: np.ndarray, qt: QuantizedWeight, decoder: Decoder) -> np.ndarray:
    """Codes as the bytes or nibbles the kernels read: integer 4-bit codes plus 8, others as
    their bits."""
    if decoder.code == "i4":
        return (codes.astype(np.int8) + NIBBLE_STORE_OFFSET).astype(np.uint8)
    bits = np.ascontiguousarray(codes).view(np.uint8)
    return bits & 0x0F if decoder.nibbles else bits


def _corrections(qt: QuantizedWeight, per_column) -> np.ndarray:
    """What each group adds per unit of sum(x) in the layout's decoding (codes decoded as
    stored, integer nibbles without their + 8): offset - (8 + zero point) * scale, in f64."""
    scale = per_column(qt, qt.scale).astype(np.float64)
    zp = 0.0 if qt.zero_point is None else per_column(qt, qt.zero_point).astype(np.float64)
    store = NIBBLE_STORE_OFFSET if qt.code.name == "i4" else 0
    offset = 0.0 if qt.offset is None else per_column(qt, qt.offset).astype(np.float64)
    return offset - (store + zp) * scale
