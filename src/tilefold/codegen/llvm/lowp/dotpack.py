"""Running the low-precision GEMM: constant B packed once, a plan per shape, one native call.

A[M, K] becomes MR-row panels and B[K, N] NR-column panels, each holding one 32-bit word per
(k-group, row or column): bf16 pairs for `vdpbf16ps`, 8-bit quads for `vpdpbusd` (K zero-padded
to whole chunks, rows and columns to whole panels), by generated code (packgen) in the call or,
for a constant B, once (`PackedB`). Kernels of s16 codes (`DotKernel.s16_codes`) get 8-bit A and
B widened to s16 pairs instead, so signed A needs nothing more; on kernels of byte quads signed
8-bit A is packed as A + 128 (u8) and the GEMM subtracts 128 * colsum(B) as it finishes a block.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from tilefold.codegen.gemm.blocking import derive_tile_blocking
from tilefold.codegen.llvm.gemm.abi import DATA_OFFSET, Entries, NativePlan, compiled_entries
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.lowp.driver import ENTRY, LParam, lowp_gemm_ir
from tilefold.codegen.llvm.lowp.kernels import CHUNK_WORDS, DotKernel
from tilefold.codegen.llvm.lowp.packgen import PACK_B_ENTRY, pack_b_ir
from tilefold.codegen.llvm.lowp.widened import prepack_widened, run_widened
from tilefold.runtime import compile_llvm_ir, num_threads
from tilefold.runtime.buffers import ALIGN, aligned_empty
from tilefold.target import Target

_P = ctypes.c_void_p
# Below this many multiply-adds a second thread costs more than it saves.
PARALLEL_MIN_MACS = 1 << 20
# The longest K whose 8-bit sums always fit int32: 255 * 128 * 65536 < 2**31. Longer products
# run as K slices of this length, each exact; their int32 sums wrap as NumPy's int32 matmul
# does, and dequantized slices add up in f32 (so the dequantized result never wraps).
EXACT_K = 1 << 16


@functools.cache
def _pack_b_entry(nr: int, g: int, target: Target, widen_bytes: bool = False):
    name = f"lowp_pack_b_{nr}x{g}{'_s8' if widen_bytes else ''}"
    compiled = compile_llvm_ir(pack_b_ir(nr, g, target, widen_bytes), target, name=name)
    return compiled.function(PACK_B_ENTRY, None, _P, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64, _P)


class PackedB:
    """A constant B[K, N] packed once for one kernel (a weight), with its column sums: NR-column
    panels of k-group words, K padded to whole 16-word chunks. A widening kernel's B stays as
    it is (`raw`, contiguous), which the GEMV streams at half the bytes of f32 (M = 1 or
    N = 1: a decode step), and gets the f32 GEMM's panels (`matrix`) when a product first needs
    them."""

    def __init__(self, b: np.ndarray, kernel: DotKernel, target: Target):
        self.kernel = kernel
        self.target = target
        self.k, self.n = b.shape
        self.dtype = b.dtype
        # K past EXACT_K: one PackedB per K slice, else None
        self.slices = [PackedB(b[s], kernel, target) for s in k_slices(kernel, self.k)] or None
        if self.slices:
            return
        if kernel.widens:
            self.raw = np.ascontiguousarray(b)
            return
        b = np.ascontiguousarray(b)
        kgp = kernel.k_words(self.k)
        self.panels = aligned_empty((math.ceil(self.n / kernel.nr), kgp, kernel.nr), np.uint32)
        _pack_b_entry(kernel.nr, kernel.kgroup, target, kernel.s16_codes)(
            b.ctypes.data, b.strides[0], self.k, self.n, kgp, self.panels.ctypes.data)
        if kernel.shifts_signed_a:  # compensates signed A (+128)
            self.colsum = b.sum(axis=0, dtype=np.int32)

    @functools.cached_property
    def matrix(self) -> PackedMatrix:
        """A widening kernel's B in the f32 GEMM's panels (widened while packed)."""
        return prepack_widened(self.raw, self.kernel, self.target)


def a_code(kernel: DotKernel, a_dtype: np.dtype) -> str:
    """How A's codes are packed for `kernel` (`packgen.A_CODES`): widened to s16 for s16-code
    kernels, s8 flipped to u8 (+128, compensated) on kernels of u8 quads, else copied."""
    if kernel.s16_codes:
        return "sext" if a_dtype == np.int8 else "zext"
    if kernel.shifts_signed_a and a_dtype == np.int8:
        return "flip"
    return "copy"


def _up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _unit_rows(mp: int, panels: int, threads: int, mr: int) -> int:
    """At most this many rows per unit (MC rows x one panel) give the threads 8 units each
    where the shape allows, so the last units taken leave little imbalance."""
    if threads == 1:
        return mp
    return min(mp, max(mr, _up(math.ceil(mp * panels / (8 * threads)), mr)))


def _padded(v: np.ndarray, size: int, dtype: type) -> np.ndarray:
    out = np.zeros(size, dtype)
    out[:len(v)] = v
    return out


@functools.lru_cache(maxsize=256)
def _plan(kernel: DotKernel, target: Target, m: int, k: int, n: int, lda: int, a_bytes: int,
          ldb: int, pack: bool, threads: int, code: str, dequant: bool,
          emulate: bool) -> tuple[NativePlan, dict[int, int], Entries]:
    """The run plan of one shape (Python work that would cost more than a small GEMM itself
    if redone per call) and its parameter values (a call adds its vectors' pointers);
    `pack`: B is raw [K, N] with rows `ldb` bytes apart, packed in the call."""
    mp, np_, kgp = _up(m, kernel.mr), _up(n, kernel.nr), kernel.k_words(k)
    blk = derive_tile_blocking(target, kernel, kgp,
                               _unit_rows(mp, np_ // kernel.nr, threads, kernel.mr), CHUNK_WORDS)
    mc, kc = blk.mc, blk.kc
    a_offset = _up(np_ * kgp * 4, ALIGN) if pack else 0
    sum_offset = a_offset + mp * kgp * 4  # packed A, then the partial sums
    next_offset = sum_offset + threads * mc * kernel.nr * 4  # then the unit counters
    values = {LParam.M: m, LParam.K: k, LParam.N: n, LParam.MP: mp, LParam.NP: np_,
              LParam.KGP: kgp, LParam.LDA: lda, LParam.A_BYTES: a_bytes, LParam.LDB: ldb,
              LParam.MC: mc, LParam.KC: kc, LParam.THREADS: threads,
              LParam.DATA_OFFSET: DATA_OFFSET, LParam.PACK_B: int(pack),
              LParam.A_OFFSET: a_offset, LParam.SUM_OFFSET: sum_offset,
              LParam.NEXT_OFFSET: next_offset}
    variant = f"{kernel.name}_{code}{'_dq' if dequant else ''}{'_emulated' if emulate else ''}"
    entries = compiled_entries(target, f"lowp_gemm_{variant}", ENTRY, lowp_gemm_ir, kernel,
                               target, code, dequant, emulate)
    plan = NativePlan(entries, LParam, values)
    plan.ws_bytes = next_offset + threads * ALIGN
    return plan, values, entries


def run_native(a: np.ndarray, b: PackedB | np.ndarray, kernel: DotKernel, target: Target,
               dequant: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
               threads: int | None, emulate: bool = False) -> np.ndarray:
    """C = A[M, K] @ B on the driver around `kernel`'s micro-kernel: B raw [K, N] (packed per
    call, in parallel) or `PackedB`; `emulate`: AMX tiles as vector code (tests)."""
    m, k = a.shape
    n = b.n if isinstance(b, PackedB) else b.shape[1]
    out_float = kernel.acc_is_float or dequant is not None
    if m == 0 or n == 0 or k == 0:  # an empty sum is 0 (dequantized: the bias)
        c = np.zeros((m, n), np.float32 if out_float else np.int32)
        return c + dequant[2].astype(np.float32) if dequant is not None else c
    # The packers read whole rows: elements within a row must be adjacent (rows may be apart).
    if a.strides[1] != a.itemsize:
        a = np.ascontiguousarray(a)
    pack = not isinstance(b, PackedB)
    if pack and b.strides[1] != b.itemsize:
        b = np.ascontiguousarray(b)
    mp, np_ = _up(m, kernel.mr), _up(n, kernel.nr)
    if threads is None:
        threads = num_threads() if m * n * k >= PARALLEL_MIN_MACS else 1
    threads = max(1, min(threads, (mp // kernel.mr) * (np_ // kernel.nr)))
    code = a_code(kernel, a.dtype)
    plan, values, entries = _plan(kernel, target, m, k, n, a.strides[0], k * a.itemsize,
                         b.strides[0] if pack else 0, pack, threads, code, dequant is not None,
                         emulate)
    # C is written once per block, so its alignment hardly matters (aligning it would cost
    # ~5 us a call, a third of a small GEMM); B's panels, read every step, are aligned.
    c = np.empty((mp, np_), np.float32 if out_float else np.int32)
    vectors = {}  # must outlive the call
    if code == "flip":
        colsum = b.colsum if not pack else b.sum(axis=0, dtype=np.int32)
        vectors[LParam.COMP] = _padded(colsum * 128, np_, np.int32)
    if dequant is not None:
        for slot, v, size in zip((LParam.ROW_SCALE, LParam.COL_SCALE, LParam.BIAS), dequant,
                                 (mp, np_, np_), strict=True):
            vectors[slot] = _padded(v, size, np.float32)
    if vectors:
        ws_bytes = plan.ws_bytes
        plan = NativePlan(entries, LParam,
                          {**values, **{slot: v.ctypes.data for slot, v in vectors.items()}})
        plan.ws_bytes = ws_bytes
    plan.run(a, b.panels if not pack else b, c)
    return c if (mp, np_) == (m, n) else np.ascontiguousarray(c[:m, :n])


def _run_widened(a, b, kernel, target, dequant, threads) -> np.ndarray:
    if isinstance(b, PackedB):  # a matrix-vector product streams the weight as it is
        b = b.raw if a.shape[0] == 1 or b.n == 1 else b.matrix
    return run_widened(a, b, kernel, target, threads)


# The GEMM of each registry row's `driver`.
_DRIVERS = {"f32": _run_widened, "lowp": run_native}


def run_dotgemm(a: np.ndarray, b: PackedB | np.ndarray, kernel: DotKernel, target: Target, *,
                dequant: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                threads: int | None = None) -> np.ndarray:
    """C = A @ B (B raw [K, N] or packed for `kernel`): f32 for bf16, i32 for 8-bit, or f32
    with `dequant` = (row_scale[M], col_scale[N], bias[N]) applied to the int32 sums."""
    slices = k_slices(kernel, a.shape[1])
    if not slices:
        return _DRIVERS[kernel.driver](a, b, kernel, target, dequant, threads)
    parts = b.slices if isinstance(b, PackedB) else [b[s] for s in slices]
    c = None
    for i, (s, part) in enumerate(zip(slices, parts, strict=True)):
        # The bias joins the first slice only; the int32 sums wrap (np.add does) like NumPy's.
        dq = dequant if dequant is None or i == 0 else (*dequant[:2], np.zeros_like(dequant[2]))
        y = _DRIVERS[kernel.driver](a[:, s], part, kernel, target, dq, threads)
        c = y if c is None else np.add(c, y, out=c)
    return c


def k_slices(kernel: DotKernel, k: int) -> list[slice]:
    """The K slices an 8-bit product of length `k` runs as (none when one call is exact)."""
    if kernel.acc_is_float or k <= EXACT_K:
        return []
    return [slice(k0, k0 + EXACT_K) for k0 in range(0, k, EXACT_K)]
