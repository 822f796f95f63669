"""Packing operands for the low-precision GEMM and running it: k-group words in panels, plans.

A[M, K] becomes MR-row panels and B[K, N] NR-column panels, each holding one 32-bit word per
(k-group, row or column): bf16 pairs for `vdpbf16ps`, 8-bit quads for `vpdpbusd` (K zero-padded
to whole groups, rows and columns to whole panels); B is packed by generated code
(tilefold.codegen.lowp.packgen). Kernels of s16 codes (`DotKernel.s16_codes`) get 8-bit A and
B widened to s16 pairs instead, so signed A needs nothing more; on kernels of byte quads signed
8-bit A is stored as A + 128 (u8) and the GEMM subtracts 128 * colsum(B) in its epilogue.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from tilefold.codegen.gemm.abi import DATA_OFFSET, NativePlan, aligned_empty, compiled_entries
from tilefold.codegen.gemm.blocking import derive_blocking
from tilefold.codegen.lowp.amxrun import run_amxgemm
from tilefold.codegen.lowp.dotgemm import ENTRY, DParam, dotgemm_ir
from tilefold.codegen.lowp.kernels import DotKernel
from tilefold.codegen.lowp.packgen import PACK_B_ENTRY, pack_b_ir
from tilefold.codegen.lowp.widened import prepack_widened, run_widened
from tilefold.runtime import compile_llvm_ir, num_threads
from tilefold.target import Target

_P = ctypes.c_void_p
# Below this many multiply-adds a second thread costs more than it saves.
PARALLEL_MIN_MACS = 1 << 20


def _words(x: np.ndarray, kgroup: int) -> np.ndarray:
    """[R, K] of 8- or 16-bit codes -> [R, K/kgroup] uint32 words (K zero-padded)."""
    bits = x.view(np.uint16 if x.itemsize == 2 else np.uint8)
    rows, k = bits.shape
    kg = math.ceil(k / kgroup) * kgroup
    if kg != k:
        bits = np.concatenate([bits, np.zeros((rows, kg - k), bits.dtype)], axis=1)
    return np.ascontiguousarray(bits).view(np.uint32)


def _panels(words: np.ndarray, unit: int) -> np.ndarray:
    """[R, KG] words -> [ceil(R/unit), KG, unit] (rows zero-padded)."""
    r, kg = words.shape
    rp = math.ceil(r / unit) * unit
    if rp != r:
        words = np.concatenate([words, np.zeros((rp - r, kg), np.uint32)])
    return np.ascontiguousarray(words.reshape(rp // unit, unit, kg).transpose(0, 2, 1))


@functools.cache
def _pack_b_entry(nr: int, g: int, target: Target, widen_bytes: bool = False):
    name = f"lowp_pack_b_{nr}x{g}{'_s8' if widen_bytes else ''}"
    compiled = compile_llvm_ir(pack_b_ir(nr, g, target, widen_bytes), target, name=name)
    return compiled.function(PACK_B_ENTRY, None, _P, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64, _P)


class PackedB:
    """A constant B[K, N] packed once for one kernel (a weight), with its column sums: NR-column
    panels of k-group words, K padded to whole tile steps for the AMX kernels; for a widening
    kernel, the f32 GEMM's panels (`matrix`)."""

    def __init__(self, b: np.ndarray, kernel: DotKernel, target: Target):
        self.kernel = kernel
        self.k, self.n = b.shape
        self.dtype = b.dtype
        if kernel.widens:
            self.matrix = prepack_widened(b if b.flags.aligned else np.ascontiguousarray(b),
                                          kernel, target)
            return
        b = np.ascontiguousarray(b)
        kgp = kernel.k_words(self.k)
        self.panels = aligned_empty((math.ceil(self.n / kernel.nr), kgp, kernel.nr), np.uint32)
        _pack_b_entry(kernel.nr, kernel.kgroup, target, kernel.s16_codes)(
            b.ctypes.data, b.strides[0], self.k, self.n, kgp, self.panels.ctypes.data)
        if kernel.shifts_signed_a:  # compensates signed A (+128)
            self.colsum = b.sum(axis=0, dtype=np.int32)


def pack_a(a: np.ndarray, kernel: DotKernel) -> np.ndarray:
    """A[M, K] as MR-row panels (8-bit widened to s16 for s16-code kernels, else signed 8-bit
    shifted to unsigned by +128)."""
    if kernel.s16_codes:
        a = a.astype(np.int16)  # u8 zero- and s8 sign-extended: exact
    elif a.dtype == np.int8 and kernel.shifts_signed_a:
        a = (a.view(np.uint8) ^ np.uint8(0x80))
    return _panels(_words(np.ascontiguousarray(a), kernel.kgroup), kernel.mr)


def _split(m: int, n: int, threads: int, kernel: DotKernel) -> tuple[int, int]:
    """Threads over the dimension with more register tiles (one splits A, the other B)."""
    if threads == 1:
        return 1, 1
    if math.ceil(n / kernel.nr) >= math.ceil(m / kernel.mr):
        return 1, threads
    return threads, 1


def _run_widened(a, b, kernel, target, dequant, threads) -> np.ndarray:
    return run_widened(a, b.matrix if isinstance(b, PackedB) else b, kernel, target, threads)


def _run_tiles(a, b, kernel, target, dequant, threads) -> np.ndarray:
    n = b.n if isinstance(b, PackedB) else b.shape[1]
    data = b.panels if isinstance(b, PackedB) else b
    return run_amxgemm(a, data, kernel, n, target, dequant=dequant, threads=threads)


def _run_dots(a, b, kernel, target, dequant, threads) -> np.ndarray:
    """The register-tile GEMM of dot steps (tilefold.codegen.lowp.dotgemm) on packed A and B."""
    pb = b if isinstance(b, PackedB) else PackedB(b, kernel, target)
    m, n = a.shape[0], pb.n
    ap = pack_a(a, kernel)
    kg = ap.shape[1]
    if threads is None:
        threads = num_threads() if m * n * pb.k >= PARALLEL_MIN_MACS else 1
    tm, tn = _split(m, n, threads, kernel)
    blk = derive_blocking(target, kernel, k=kg)
    dq = dequant is not None
    c = np.empty((m, n), np.float32 if kernel.acc_is_float or dq else np.int32)
    comp = np.zeros(n, np.int32)
    if kernel.shifts_signed_a and a.dtype == np.int8:
        comp = (pb.colsum * 128).astype(np.int32)
    ptrs = {DParam.COMP: comp.ctypes.data}
    if dq:  # the arrays must outlive the call
        arrays = [np.ascontiguousarray(v, np.float32) for v in dequant]
        ptrs.update({DParam.ROW_SCALE: arrays[0].ctypes.data,
                     DParam.COL_SCALE: arrays[1].ctypes.data, DParam.BIAS: arrays[2].ctypes.data})
    entries = compiled_entries(target, f"dotgemm_{kernel.name}{'_dq' if dq else ''}", ENTRY,
                               dotgemm_ir, kernel, target, dq)
    values = {DParam.M: m, DParam.N: n, DParam.KG: kg, DParam.LDC: n, DParam.MC: blk.mc,
              DParam.KC: blk.kc, DParam.TM: tm, DParam.TN: tn, DParam.THREADS: tm * tn,
              DParam.DATA_OFFSET: DATA_OFFSET, **ptrs}
    NativePlan(entries, DParam, values).run(ap, pb.panels, c)
    return c


# The GEMM of each registry row's `driver`.
_DRIVERS = {"f32": _run_widened, "amx": _run_tiles, "dot": _run_dots}


def run_dotgemm(a: np.ndarray, b: PackedB | np.ndarray, kernel: DotKernel, target: Target, *,
                dequant: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                threads: int | None = None) -> np.ndarray:
    """C = A @ B (B raw [K, N] or packed for `kernel`): f32 for bf16, i32 for 8-bit, or f32
    with `dequant` = (row_scale[M], col_scale[N], bias[N]) applied to the int32 sums."""
    return _DRIVERS[kernel.driver](a, b, kernel, target, dequant, threads)
