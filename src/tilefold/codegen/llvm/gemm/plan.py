"""Per-(shape, strides) execution plans: everything decided once, so a call is one ctypes call."""

from __future__ import annotations

import itertools
import math

import numpy as np

from tilefold.codegen.gemm.blocking import Blocking, balanced_block, derive_blocking
from tilefold.codegen.llvm.gemm.abi import DATA_OFFSET, NativePlan
from tilefold.codegen.llvm.gemm.driver import BMode, Param
from tilefold.codegen.llvm.gemm.gemv import GemvMode, GemvParam
from tilefold.codegen.llvm.gemm.gemv_config import GemvConfig, derive_gemv_config
from tilefold.codegen.llvm.gemm.module import GemmModule, gemm_module
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.errors import UnsupportedError
from tilefold.runtime.replay import NativeCall

# Below this many flops a second thread costs more (wake-up, split) than it saves.
PARALLEL_MIN_FLOPS = 2_000_000
# A GEMV streams its matrix (two flops a four-byte weight): from this many bytes of it a second
# thread's share of the memory bandwidth pays for its wake-up (a decode step's projections,
# 1-4 MB each, read from DRAM: one core draws ~28 of a Zen 4's 48 GB/s).
GEMV_PARALLEL_MIN_BYTES = 256 * 1024
# A kernel keeping its A micro-panel in L1 runs a K up to this many KCs as one K block (the
# panel then takes up to a quarter of L1 instead of a sixth): each further K block loads and
# stores every C tile once more (1024x1536x384 at 2 threads, rocketlake: one block of 384
# +5% over two of 192; large products unchanged).
ONE_K_BLOCK_SLACK = 1.5


def _parts(extent: int, parts: int, unit: int) -> list[int]:
    """Sizes of the `parts` pieces the driver's `_split` cuts `extent` into (whole `unit`s)."""
    units = math.ceil(extent / unit)
    bounds = [min(extent, units * i // parts * unit) for i in range(parts + 1)]
    return [hi - lo for lo, hi in itertools.pairwise(bounds)]


# Cost of a micro-panel narrower than NR relative to a full one, per vector it holds, plus a
# fixed share (the A broadcasts and loop overhead do not shrink with it), and of packing one
# B panel relative to computing one MR x NR tile over the same K.
# A row tile also pays for fetching its A micro-panel, once per sweep over the thread's panels.
# Fitted to 2-thread timings (M over N: sq384 +11%, sq512 +8%, sq640 +6%; N over M at 50-128 rows).
_PARTIAL_PANEL_OVERHEAD = 0.4
_PACK_PANEL_COST = 0.25
_ROW_TILE_COST = 0.5
# A grid other than the rule's preferred one must be this much cheaper by `_part_cost`.
_SPLIT_MARGIN = 0.02


def _part_cost(rows: int, cols: int, kern, bmode: BMode) -> float:
    """Work of one thread's rows x cols block in full-tile units: row tiles x (panels + A
    fetch), plus packing its B panels (over M each thread packs all of B, over N its part)."""
    if rows <= 0 or cols <= 0:
        return 0.0
    full, rem = divmod(cols, kern.nr)
    panels = full + (math.ceil(rem / kern.lanes) / kern.nv + _PARTIAL_PANEL_OVERHEAD
                     if rem else 0.0)
    cost = math.ceil(rows / kern.mr) * (panels + _ROW_TILE_COST)
    if bmode == BMode.PACK:
        cost += _PACK_PANEL_COST * math.ceil(cols / kern.nr)
    return cost


def k_block(kern, k: int, kc: int) -> int:
    """The K block for a K of `k` under the blocking's `kc`: balanced blocks of at most `kc`,
    or all of K in one block (C's tiles stored once) on kernels keeping A's micro-panel in L1
    when K is at most ONE_K_BLOCK_SLACK * kc."""
    if kern.a_in_l1 and k <= ONE_K_BLOCK_SLACK * kc:
        return math.ceil(k / 4) * 4
    return balanced_block(k, kc, 4)


class GemmPlan(NativePlan):
    """A ready-to-run (batched) GEMM of fixed shapes and strides; `run(a, b, c)`."""

    def __init__(self, module: GemmModule, m: int, n: int, k: int, strides: tuple[int, ...],
                 offsets: np.ndarray, beta: int, threads: int, bmode: BMode,
                 blocking: Blocking | None = None, stream: bool | None = None):
        kern = module.kernel
        batch = len(offsets)
        threads = max(1, threads if 2 * m * n * k * batch >= PARALLEL_MIN_FLOPS else 1)
        blk = blocking or derive_blocking(module.target, kern, threads)
        n_unit = kern.nr if bmode == BMode.PREPACKED else kern.lanes
        b_bytes, l2 = 4 * k * n, module.target.l2_bytes
        b_in_l2 = bmode == BMode.DIRECT and b_bytes <= l2 // 8
        # B that half of L2 holds stays there from call to call: prefetching it only costs.
        stream = b_bytes > l2 // 2 if stream is None else stream
        tm, tn = self._split(m, n, batch, threads, kern, bmode, n_unit, b_in_l2)
        mc = balanced_block(max(_parts(m, tm, kern.mr)), blk.mc, kern.mr)
        kc = k_block(kern, k, blk.kc) if blocking is None else balanced_block(k, blk.kc, 4)
        nc = balanced_block(max(_parts(n, tn, n_unit)), blk.nc, kern.nr)
        ws_floats = mc * kc + kc * min(nc, math.ceil(n / kern.lanes) * kern.lanes) + 16
        ws_floats = math.ceil(ws_floats / 16) * 16
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        rsa, csa, rsb, csb, rsc = strides
        values = {Param.M: m, Param.N: n, Param.K: k, Param.RSA: rsa, Param.CSA: csa,
                  Param.RSB: rsb, Param.CSB: csb, Param.RSC: rsc, Param.BETA: beta,
                  Param.BATCH: batch, Param.TM: tm, Param.TN: tn, Param.THREADS: threads,
                  Param.BMODE: bmode, Param.OFFSETS: self.offsets.ctypes.data,
                  Param.WS_PER_THREAD: ws_floats, Param.MC: mc, Param.KC: kc, Param.NC: nc,
                  Param.DATA_OFFSET: DATA_OFFSET, Param.N_UNIT: n_unit,
                  Param.STREAM: int(stream)}
        super().__init__(module.entries, Param, values)
        self.pointed = (self.offsets,)
        self.threads = threads
        self.kernel = kern
        self.bmode = bmode
        self.stream = stream
        self.blocking = Blocking(mc, kc, nc)
        self.split = (tm, tn)
        self.ws_bytes = ws_floats * 4 * threads

    @staticmethod
    def _split(m: int, n: int, batch: int, threads: int, kern, bmode: BMode = BMode.PACK,
               n_unit: int | None = None, b_in_l2: bool = False) -> tuple[int, int]:
        """Threads over batch entries first, then a TM x TN grid over one entry: the grid whose
        busiest thread has the least work by `_part_cost` (M parts in whole MR row tiles, N parts
        in `n_unit` columns: the vector width, or NR for pre-packed panels). Ties keep N for
        kernels reading A in place (a split over M re-packs B per thread), else the dimension
        with more register tiles.

        Splitting N in whole NR panels left 48 of 128 columns to one thread and 80 to the other
        (sq128), 240/272 at N = 512; vector-width parts even these out, and when B is read in
        place a split over M duplicates nothing, so e.g. 128 x 128 splits rows 64/64.
        `b_in_l2` (B read in place, all of it in 1/8 of L2) makes M the tie-break and drops the
        margin: each thread then sweeps full panels of a cached B (sq256: 275 -> 293 GFLOP/s).
        A larger B read in place stays split over N: over M both threads would stream it."""
        if batch >= threads or threads == 1:
            return 1, 1
        per = max(1, threads // batch)
        n_unit = n_unit or kern.nr
        m_tiles, n_tiles = math.ceil(m / kern.mr), math.ceil(n / kern.nr)
        prefer_n = not b_in_l2 and ((kern.a_direct and n_tiles >= per) or n_tiles > m_tiles)
        margin = 0.0 if b_in_l2 else _SPLIT_MARGIN
        grids = [(tm, per // tm) for tm in range(1, per + 1) if per % tm == 0]
        # The rule's grid sorts first; another must beat it by `_SPLIT_MARGIN` (the model is rough).
        grids.sort(key=lambda g: g[0] if prefer_n else -g[0])
        best, best_cost = grids[0], math.inf
        for tm, tn in grids:
            if tm > m_tiles or tn > math.ceil(n / n_unit):
                continue
            cost = max(_part_cost(rows, cols, kern, bmode)
                       for rows in _parts(m, tm, kern.mr) for cols in _parts(n, tn, n_unit))
            if cost < best_cost * (1 - margin) or best_cost == math.inf:
                best, best_cost = (tm, tn), cost
        return best

    __call__ = NativePlan.run


class GemvPlan(NativePlan):
    """y (+)= W x for a GEMM with M = 1 or N = 1; `__call__(a, b, c)` maps the operands."""

    def __init__(self, module: GemmModule, n_out: int, k: int, ldw: int, incx: int, incy: int,
                 beta: int, threads: int, mode: GemvMode, w_is_a: bool,
                 config: GemvConfig | None = None):
        threads = max(1, threads if 4 * n_out * k >= GEMV_PARALLEL_MIN_BYTES else 1)
        config = config or derive_gemv_config(module.target, mode, threads)
        values = {GemvParam.N_OUT: n_out, GemvParam.K: k, GemvParam.LDW: ldw,
                  GemvParam.INC_X: incx, GemvParam.INC_Y: incy, GemvParam.BETA: beta,
                  GemvParam.THREADS: threads, GemvParam.MODE: mode,
                  GemvParam.DATA_OFFSET: DATA_OFFSET, GemvParam.PREFETCH: config.ahead,
                  GemvParam.PANEL: config.panel or max(1, n_out)}
        super().__init__(module.gemv_entries, GemvParam, values)
        self.threads = threads
        self.mode = mode
        self.w_is_a = w_is_a
        self.config = config

    def __call__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        if self.w_is_a:
            self.run(b, a, c)
        else:
            self.run(a, b, c)

    def call(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> NativeCall | None:
        return super().call(b, a, c) if self.w_is_a else super().call(a, b, c)


class EmptyKPlan:
    """C (+)= A @ B with K = 0: nothing to add, so C becomes zeros (beta 0) or stays (beta 1)."""

    def __init__(self, beta: int):
        self.beta = beta

    def __call__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        if not self.beta:
            c[...] = 0

    def call(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        """Nothing native to replay (NumPy zeroes C)."""
        return None


def _batch_offsets(batch_shape, *arrays_and_strides) -> np.ndarray:
    """[batch, 3] element offsets of each batch entry in A, B, C (broadcast dims: stride 0)."""
    if not batch_shape:
        return np.zeros((1, 3), np.int64)
    idx = np.indices(batch_shape).reshape(len(batch_shape), -1)
    cols = []
    for shape, strides in arrays_and_strides:
        lead = len(batch_shape) - len(shape)
        off = np.zeros(idx.shape[1], np.int64)
        for d, (size, stride) in enumerate(zip(shape, strides, strict=True)):
            if size != 1:
                off += idx[lead + d] * stride
        cols.append(off)
    return np.stack(cols, axis=1)


def choose_bmode(m: int, n: int, k: int, rsb: int, csb: int, module: GemmModule,
                 threads: int) -> BMode:
    """Read B in place (rows contiguous) when few row panels would reuse a packed copy, or when
    the B block each A micro-panel sweeps is small enough to stay in cache in place and its
    micro-panel's rows do not crowd L1's sets: then packing is pure overhead (+7% on
    12x128x128x64 on a Xeon, 12-way L1; 5-35% lost on blocks over 1/8 of L2). On an 8-way L1
    the same product lost 14% in place: its 64 rows, 512 bytes apart, share 8 sets."""
    kern = module.kernel
    if csb != 1 or n < kern.nr:
        return BMode.PACK
    if m <= DIRECT_B_MAX_M:
        return BMode.DIRECT
    blk = derive_blocking(module.target, kern, threads)
    rows = min(k, blk.kc)
    if (m <= DIRECT_B_SMALL_MAX_M and rows * min(n, blk.nc) * 4 <= module.target.l2_bytes // 8
            and not _crowds_l1(module.target.l1d_bytes, rows, rsb * 4, kern.nr * 4)):
        return BMode.DIRECT
    return BMode.PACK


# Up to this many rows of C, packing B costs more than it saves (each panel is used M/MR times).
DIRECT_B_MAX_M = 16
# Up to this many rows, a B block in at most 1/8 of L2 is read in place (measured on a Xeon).
DIRECT_B_SMALL_MAX_M = 256
# An L1 data cache way: 64 sets of 64-byte lines, indexed by the offset within a 4 KiB page
# (what lets x86 L1s be looked up before address translation).
L1_WAY_BYTES, LINE_BYTES = 4096, 64


def _crowds_l1(l1_bytes: int, rows: int, row_bytes: int, panel_bytes: int) -> bool:
    """Whether `rows` rows of `panel_bytes`, `row_bytes` apart (a micro-panel of B read in
    place), put as many lines on each L1 set they map to as the set has ways: A's panel and
    C then evict them, and every k-step's B comes from L2."""
    ways = max(1, l1_bytes // L1_WAY_BYTES)
    lines_per_row = math.ceil(panel_bytes / LINE_BYTES)
    period = L1_WAY_BYTES // math.gcd(row_bytes, L1_WAY_BYTES)  # rows until a set repeats
    sets = min(period * lines_per_row, L1_WAY_BYTES // LINE_BYTES)
    return math.ceil(rows * lines_per_row / sets) >= ways


def _for_shape(module: GemmModule, n: int, csa: int, prepacked: bool = False) -> GemmModule:
    """The module of the micro-kernel for this product's shape class: with A rows contiguous,
    a narrow kernel when C is at most its NR wide, else the "rows" kernel (A read in place)
    up to its `max_n` columns; a target without such entries keeps the general one. B
    pre-packed into `module`'s panels can only go to a kernel with the same panels, and not
    to a "rows" kernel of any width: with no B to pack per call, packing A pays (avx512_8x48
    over avx512_8x48_rows on rocketlake, 2 threads: +2-7% on the MiniLM products, 0-4% on
    32-256 rows; with B packed per call the rows kernel wins 2-10%)."""
    kern = module.kernel
    if kern.shape_class != "general" or csa != 1:
        return module
    for shape_class in ("narrow", "rows"):
        entry = select_microkernel(module.target, kern.dtype, shape_class)
        widest = entry.nr if shape_class == "narrow" else entry.max_n
        if prepacked and widest is None:
            continue
        if (entry.shape_class == shape_class and (widest is None or n <= widest)
                and (not prepacked or (entry.nr, entry.lanes) == (kern.nr, kern.lanes))):
            return gemm_module(module.target, entry)
    return module


def _gemv_plan(module, m, n, k, sa, sb, sc, beta, threads) -> GemvPlan | None:
    """A matrix-vector plan when one of M, N is 1 and the matrix is contiguous one way."""
    (rsa, csa), (rsb, csb), (rsc, csc) = sa, sb, sc
    if m == 1:  # y[j] = sum_k B[k, j] x[k], x = A's row, y = C's row
        if csb == 1:
            return GemvPlan(module, n, k, rsb, csa, csc, beta, threads, GemvMode.AXPY, False)
        if rsb == 1 and csa == 1:
            return GemvPlan(module, n, k, csb, csa, csc, beta, threads, GemvMode.DOT, False)
    elif n == 1:  # y[i] = sum_k A[i, k] x[k], x = B's column, y = C's column
        if csa == 1 and rsb == 1:
            return GemvPlan(module, m, k, rsa, rsb, rsc, beta, threads, GemvMode.DOT, True)
        if rsa == 1 and rsc == 1:
            return GemvPlan(module, m, k, csa, rsb, rsc, beta, threads, GemvMode.AXPY, True)
    return None


def make_plan(module: GemmModule, a: np.ndarray, b: np.ndarray | PackedMatrix, c: np.ndarray,
              beta: int, threads: int, blocking: Blocking | None = None,
              bmode: BMode | None = None, stream: bool | None = None
              ) -> GemmPlan | GemvPlan | EmptyKPlan:
    """Plan C (+)= A @ B for arrays of these shapes and strides (batch dims broadcast); the plan
    is called as `plan(a, b, c)` with `b` as given (an ndarray or a `PackedMatrix`'s data).

    `c` must have a unit column stride. A and B (unless pre-packed) hold `module.src` elements
    (C f32); other than f32 they are read in place by the GEMV (M or N = 1, widened as loaded)
    and otherwise always packed: no in-place kernel or B. `blocking`, `bmode` and `stream`
    (whether tiles prefetch the next tiles' B) override the plan's own choices."""
    m, k = a.shape[-2:]
    n = c.shape[-1]
    if k == 0:
        return EmptyKPlan(beta)
    widened = module.src != "f32"

    def es(x, el):
        return tuple(s // el for s in x.strides)

    sa, sc = es(a, a.itemsize), es(c, 4)
    packed = isinstance(b, PackedMatrix)
    sb = (0, 0) if packed else es(b, b.itemsize)
    b_batch = ((), ()) if packed else (b.shape[:-2], sb[:-2])
    batch_shape, a_batch, b_batch, m, sa, sc = _fold_rows(
        c.shape[:-2], (a.shape[:-2], sa[:-2]), b_batch, m, sa, sc)
    if (not packed and math.prod(batch_shape) == 1 and (m == 1 or n == 1)
            and bmode is None and blocking is None):
        gemv = _gemv_plan(module, m, n, k, sa[-2:], sb[-2:], sc[-2:], beta, threads)
        if gemv is not None:
            return gemv
    if blocking is None and not widened:
        module = _for_shape(module, n, sa[-1], prepacked=packed)
    if packed:
        bmode = BMode.PREPACKED
    elif bmode is None:
        bmode = (BMode.PACK if widened
                 else choose_bmode(m, n, k, sb[-2], sb[-1], module, threads))
    elif widened and bmode == BMode.DIRECT:
        raise UnsupportedError(f"GEMM: {module.src} B cannot be read in place; it is "
                               "widened while packed (use BMode.PACK)")
    offsets = _batch_offsets(batch_shape, a_batch, b_batch, (batch_shape, sc[:-2]))
    strides = (sa[-2], sa[-1], sb[-2], sb[-1], sc[-2])
    return GemmPlan(module, m, n, k, strides, offsets, beta, threads, bmode, blocking, stream)


def _fold_rows(batch_shape: tuple, a_batch: tuple, b_batch: tuple, m: int, sa: tuple,
               sc: tuple) -> tuple:
    """Fold C's innermost batch dims into M where B is the same for every entry and A's and
    C's entries follow one another row after row ([8, 128, K] @ [K, N] is one 1024-row
    product: one thread split and one B sweep for all rows, not eight 128-row products).
    Returns (batch_shape, a_batch, b_batch, m, sa, sc) with the folded dims dropped."""
    def aligned(shape, strides):  # padded to C's batch rank: a missing dim is broadcast
        lead = len(batch_shape) - len(shape)
        return [1] * lead + list(shape), [0] * lead + list(strides)

    (a_shape, a_str), (b_shape, b_str) = aligned(*a_batch), aligned(*b_batch)
    c_str = list(sc[:-2])
    rows = m
    while batch_shape:
        size = batch_shape[-1]
        if size != 1 and not (a_shape[-1] == size and (b_shape[-1] == 1 or b_str[-1] == 0)
                              and a_str[-1] == rows * sa[-2] and c_str[-1] == rows * sc[-2]):
            break
        rows *= size
        batch_shape = batch_shape[:-1]
        for dims in (a_shape, a_str, b_shape, b_str, c_str):
            dims.pop()
    return (batch_shape, (tuple(a_shape), tuple(a_str)), (tuple(b_shape), tuple(b_str)), rows,
            (*a_str, *sa[-2:]), (*c_str, *sc[-2:]))
