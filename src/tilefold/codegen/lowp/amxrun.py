"""Running the AMX GEMM from Python: blocking, the parameter block, padded C."""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from tilefold.codegen.gemm.plan import DATA_OFFSET, _Plan
from tilefold.codegen.lowp.amxgemm import BLOCK, ENTRY, KSTEP, AParam, amxgemm_ir
from tilefold.codegen.lowp.kernels import DotKernel
from tilefold.runtime import compile_llvm_ir, num_threads, thread_pool
from tilefold.target import Target

_P = ctypes.c_void_p
# Below this many multiply-adds a second thread costs more than it saves.
PARALLEL_MIN_MACS = 1 << 21
_ALIGN = 64


def _up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@functools.cache
def _module(kernel: DotKernel, target: Target, dequant: bool):
    thread_pool()  # `tilefold_parallel` must exist before the module links
    compiled = compile_llvm_ir(amxgemm_ir(kernel, target, dequant), target,
                               name=f"amxgemm_{kernel.name}{'_dq' if dequant else ''}")
    obj = ctypes.py_object
    return (compiled.function(ENTRY, None, _P, obj, obj, obj, _P),
            compiled.function(ENTRY, None, _P, _P, _P, _P, _P))


def amx_k_words(k: int, kernel: DotKernel) -> int:
    """k-group words of K, padded to whole tile steps."""
    return _up(math.ceil(k / kernel.kgroup), KSTEP)


def _blocking(target: Target, kgp: int, m_share: int) -> tuple[int, int]:
    """(MC rows, KC words). Tile loads, not cache misses, bound these kernels (each costs
    about three tile products here, from L1 or L2 alike), so C stays in tiles over all of K
    (KC = K: no partial sums to reload) unless a K x 32 B panel would outgrow a quarter of L2,
    and MC keeps a block of packed A near L1 (measured best at 32-64 KiB)."""
    panel_words = target.l2_bytes // 4 // (BLOCK * 4) // KSTEP * KSTEP
    kc = min(kgp, max(KSTEP, panel_words))
    mc = target.l2_bytes // 32 // (kgp * 4) // BLOCK * BLOCK
    return min(max(BLOCK, mc), _up(m_share, BLOCK)), kc


def _split(mp: int, np_: int, threads: int) -> tuple[int, int]:
    """Threads over the dimension with more 32-wide blocks."""
    if threads == 1:
        return 1, 1
    return (1, threads) if np_ >= mp else (threads, 1)


def _padded(v: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, np.float32)
    out[:len(v)] = v
    return out


def run_amxgemm(a: np.ndarray, b, kernel: DotKernel, n: int, target: Target, *,
                dequant: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                threads: int | None = None) -> np.ndarray:
    """C = A[M, K] @ B with B raw [K, N] (packed per call, in parallel) or `PackedB` panels;
    f32 for bf16, i32 for 8-bit, or f32 with `dequant` = (row_scale[M], col_scale[N], bias[N])."""
    m, k = a.shape
    mp, np_, kgp = _up(m, BLOCK), _up(n, BLOCK), amx_k_words(k, kernel)
    if threads is None:
        threads = num_threads() if m * n * k >= PARALLEL_MIN_MACS else 1
    threads = max(1, min(threads, (mp // BLOCK) * (np_ // BLOCK)))
    tm, tn = _split(mp, np_, threads)
    mc, kc = _blocking(target, kgp, math.ceil(mp / tm))
    pack = b.ndim == 2
    a_offset = _up(np_ * kgp * 4, _ALIGN) if pack else 0
    sum_offset = a_offset + mp * kgp * 4  # packed A, then the partial sums
    out_float = kernel.acc_is_float or dequant is not None
    c = np.empty((mp, np_), np.float32 if out_float else np.int32)
    values = {AParam.M: m, AParam.K: k, AParam.N: n, AParam.MP: mp, AParam.NP: np_,
              AParam.KGP: kgp, AParam.LDA: a.strides[0],
              AParam.LDB: b.strides[0] if pack else 0, AParam.MC: mc, AParam.KC: kc,
              AParam.TM: tm, AParam.TN: tn, AParam.THREADS: threads,
              AParam.DATA_OFFSET: DATA_OFFSET, AParam.PACK_B: int(pack),
              AParam.A_OFFSET: a_offset, AParam.SUM_OFFSET: sum_offset}
    keep = []
    if dequant is not None:
        keep = [_padded(v, size) for v, size in zip(dequant, (mp, np_, np_), strict=True)]
        values.update({AParam.ROW_SCALE: keep[0].ctypes.data,
                       AParam.COL_SCALE: keep[1].ctypes.data, AParam.BIAS: keep[2].ctypes.data})
    entry_objects, entry_raw = _module(kernel, target, dequant is not None)
    plan = _Plan(entry_objects, entry_raw, values, len(AParam))
    plan.ws_bytes = sum_offset + threads * mc * BLOCK * 4
    plan.run(a, b, c)
    return c if (mp, np_) == (m, n) else np.ascontiguousarray(c[:m, :n])
