"""Running the AMX GEMM from Python: blocking and the parameter block, planned once per shape."""

from __future__ import annotations

import functools
import math

import numpy as np

from tilefold.codegen.gemm.abi import ALIGN, DATA_OFFSET, NativePlan, compiled_entries
from tilefold.codegen.gemm.blocking import derive_tile_blocking
from tilefold.codegen.lowp.amxgemm import BLOCK, ENTRY, KSTEP, ROWS, AParam, amxgemm_ir
from tilefold.codegen.lowp.kernels import DotKernel
from tilefold.runtime import num_threads
from tilefold.target import Target

# Below this many multiply-adds a second thread costs more than it saves.
PARALLEL_MIN_MACS = 1 << 21
# Tile rows are 64 bytes (`ALIGN`): an unaligned row straddles two cache lines and a tile load
# or store of 16 such rows runs at a fraction of the speed (measured: about 3x slower from L1).


def _up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _entries(kernel: DotKernel, target: Target, dequant: bool):
    return compiled_entries(target, f"amxgemm_{kernel.name}{'_dq' if dequant else ''}", ENTRY,
                            amxgemm_ir, kernel, target, dequant)


def _unit_rows(mp: int, panels: int, threads: int) -> int:
    """At most this many rows per unit (MC rows x one panel) give the threads 8 units each
    where the shape allows, so the last units taken leave little imbalance."""
    if threads == 1:
        return mp
    return min(mp, max(ROWS, _up(math.ceil(mp * panels / (8 * threads)), ROWS)))


def _padded(v: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, np.float32)
    out[:len(v)] = v
    return out


@functools.lru_cache(maxsize=256)
def _plan(kernel: DotKernel, target: Target, m: int, k: int, n: int, lda: int, ldb: int,
          pack: bool, threads: int, dequant: bool) -> tuple[NativePlan, dict[int, int]]:
    """The run plan of one shape (Python work that would cost more than a small GEMM itself
    if redone per call) and its parameter values (a dequantizing call adds its vectors);
    `pack`: B is raw [K, N] with rows `ldb` bytes apart, packed in the call."""
    mp, np_, kgp = _up(m, ROWS), _up(n, BLOCK), kernel.k_words(k)
    blk = derive_tile_blocking(target, kernel, kgp, _unit_rows(mp, np_ // BLOCK, threads), KSTEP)
    mc, kc = blk.mc, blk.kc
    a_offset = _up(np_ * kgp * 4, ALIGN) if pack else 0
    sum_offset = a_offset + mp * kgp * 4  # packed A, then the partial sums
    next_offset = sum_offset + threads * mc * BLOCK * 4  # then the unit counters
    values = {AParam.M: m, AParam.K: k, AParam.N: n, AParam.MP: mp, AParam.NP: np_,
              AParam.KGP: kgp, AParam.LDA: lda, AParam.LDB: ldb, AParam.MC: mc, AParam.KC: kc,
              AParam.THREADS: threads, AParam.DATA_OFFSET: DATA_OFFSET,
              AParam.PACK_B: int(pack), AParam.A_OFFSET: a_offset,
              AParam.SUM_OFFSET: sum_offset, AParam.NEXT_OFFSET: next_offset}
    plan = NativePlan(_entries(kernel, target, dequant), AParam, values)
    plan.ws_bytes = next_offset + threads * ALIGN
    return plan, values


def run_amxgemm(a: np.ndarray, b: np.ndarray, kernel: DotKernel, n: int, target: Target, *,
                dequant: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                threads: int | None = None) -> np.ndarray:
    """C = A[M, K] @ B with B raw [K, N] (packed per call, in parallel) or the panels of a
    `tilefold.codegen.lowp.dotpack.PackedB` ([N / 32, K words, 32]);
    f32 for bf16, i32 for 8-bit, or f32 with `dequant` = (row_scale[M], col_scale[N], bias[N])."""
    m, k = a.shape
    # The packers read whole rows: elements within a row must be adjacent (rows may be apart).
    if a.strides[1] != a.itemsize:
        a = np.ascontiguousarray(a)
    if b.ndim == 2 and b.strides[1] != b.itemsize:
        b = np.ascontiguousarray(b)
    mp, np_ = _up(m, ROWS), _up(n, BLOCK)
    if threads is None:
        threads = num_threads() if m * n * k >= PARALLEL_MIN_MACS else 1
    threads = max(1, min(threads, (mp // ROWS) * (np_ // BLOCK)))
    pack = b.ndim == 2
    plan, values = _plan(kernel, target, m, k, n, a.strides[0], b.strides[0] if pack else 0,
                         pack, threads, dequant is not None)
    out_float = kernel.acc_is_float or dequant is not None
    # C is written once per 16 x 32 block, so its alignment hardly matters (aligning it would
    # cost ~5 us a call, a third of a small GEMM); B's panels, read every step, are aligned.
    c = np.empty((mp, np_), np.float32 if out_float else np.int32)
    if dequant is not None:
        keep = [_padded(v, size) for v, size in zip(dequant, (mp, np_, np_), strict=True)]
        scaled = NativePlan(_entries(kernel, target, True), AParam, {
            **values, AParam.ROW_SCALE: keep[0].ctypes.data,
            AParam.COL_SCALE: keep[1].ctypes.data, AParam.BIAS: keep[2].ctypes.data})
        scaled.ws_bytes = plan.ws_bytes
        plan = scaled
    plan.run(a, b, c)
    return c if (mp, np_) == (m, n) else np.ascontiguousarray(c[:m, :n])
