"""How B is packed and tails accumulate: B packed a chunk of panels at a time just before the
first tiles that use it (taking turns in one chunk's buffer when one MC block covers M), B
packed in bands of rows, and row tails that keep several accumulator sets. Each against the
float64 oracle, on every micro-kernel the host runs, for edges of every loop."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.gemm.blocking import Blocking
from tilefold.codegen.llvm.gemm import driver, packing
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import BMode, make_plan
from tilefold.codegen.llvm.gemm.registry import MICROKERNELS, TAIL_CHAINS
from tilefold.target import host_target

_HOST = [k for k in MICROKERNELS if host_target().has(*k.features) and k.dtype == "f32"]
# Both loop orders on every host: the host's kernels, and its first one with the other order
# (A micro-panel in L1, B panels streaming: the AVX-512 kernels' order).
KERNELS = [*_HOST, dataclasses.replace(_HOST[0], name=f"{_HOST[0].name}_swapped",
                                       a_in_l1=not _HOST[0].a_in_l1)]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


def _run(kern, m, n, k, threads, beta, rng):
    """C (+)= A @ B through a plan forced to pack B per call, with small blocks: K in three
    blocks (the last ragged), N over two NC blocks of two chunks each plus a narrow panel."""
    chunk = kern.nr * driver.PACK_PANELS
    blocking = Blocking(mc=kern.mr * 3, kc=48, nc=2 * chunk + kern.nr)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c0 = rng.standard_normal((m, n), dtype=np.float32)
    c = c0.copy()
    plan = make_plan(gemm_module(host_target(), kern), a, b, c, beta, threads,
                     blocking=blocking, bmode=BMode.PACK)
    plan(a, b, c)
    if beta:  # C0 + A @ B is the product of [A, I] and [[B], [C0]]
        check_matmul(c, np.hstack([a, np.eye(m, dtype=np.float32)]), np.vstack([b, c0]))
    else:
        check_matmul(c, a, b)


@pytest.mark.parametrize("kern", KERNELS, ids=lambda k: k.name)
def test_b_packed_on_the_way_in_one_block_of_rows_and_in_several(kern, rng):
    """M within one MC block (the chunk buffer reused), and M over two or three blocks (the
    whole NC block packed while the first block's tiles run, read by the next)."""
    mr = kern.mr
    chunk = kern.nr * driver.PACK_PANELS
    for m, n, threads, beta in itertools.product(
            (1, mr - 1, mr + 1, 3 * mr, 3 * mr + 1, 7 * mr + 2),
            (5, chunk + 3, 2 * chunk + kern.nr + 1, 5 * chunk + 7), (1, 2), (0, 1)):
        _run(kern, m, n, 2 * 48 + 7, threads, beta, rng)


@pytest.mark.parametrize("kern", KERNELS, ids=lambda k: k.name)
def test_row_tails_with_several_sets_sum_every_k_step(kern, rng):
    """Every tail height, K from 1 to past the sets' unrolling (the remainder loop alone, the
    sets alone and both); a set left out of the sum or a step counted twice fails."""
    sets = {mr: kern.spec(mr, kern.nv).sets for mr in kern.m_sizes}
    assert sets[kern.mr] == 1
    assert all(s == max(1, min(4, TAIL_CHAINS // (mr * kern.nv))) for mr, s in sets.items())
    for m in range(1, kern.mr):
        for k in (1, 2, 3, 5, 9, 47, 48, 50):
            _run(kern, m, 2 * kern.nr - 3, k, 1, 0, rng)


def test_bands_and_their_leftover_rows_pack_b_in_panel_order(rng):
    """pack_b on rows in bands of `BAND_ROWS` plus leftover rows, full panels plus a narrow one: the
    panel layout (k-major, NR floats per k, the narrow panel padded with zeros)."""
    kern = KERNELS[0]
    module = gemm_module(host_target(), kern)
    nr, lanes = kern.nr, kern.lanes
    for kc, nc in ((packing.BAND_ROWS * 3 + 5, 3 * nr + 3), (packing.BAND_ROWS - 1, nr), (1, 1)):
        src = rng.standard_normal((kc, nc + 4), dtype=np.float32)  # rows 4 floats apart more
        full, rest = divmod(nc, nr)
        w = -(-rest // lanes) * lanes
        dst = np.full(full * nr * kc + w * kc, np.nan, np.float32)
        module.pack_b(kc, nc, src.ctypes.data, nc + 4, 1, dst.ctypes.data)
        want = [src[:, p * nr:(p + 1) * nr].ravel() for p in range(full)]
        if rest:
            want.append(np.pad(src[:, full * nr:nc], ((0, 0), (0, w - rest))).ravel())
        np.testing.assert_array_equal(dst, np.concatenate(want))


@pytest.mark.parametrize("kern", _HOST, ids=lambda k: k.name)
def test_transposed_b_packs_in_panel_order(kern, rng):
    """pack_b on B's transpose (a weight W[n, k] read as W.T: columns contiguous along k): full
    panels in square blocks transposed in registers, the k-steps past the last block, a narrow
    panel and a k-stride other than 1 element by element; the same layout as from rows."""
    module = gemm_module(host_target(), kern)
    nr, lanes = kern.nr, kern.lanes
    for kc, nc, k_step in ((4 * lanes + 3, 3 * nr + 5, 1), (lanes, nr, 1), (lanes - 1, nr, 1),
                           (2 * lanes + 1, 2 * nr + 1, 2), (1, 1, 1)):
        w_rows = rng.standard_normal((nc, kc * k_step + 3), dtype=np.float32)  # W[n, k]
        b = w_rows[:, :kc * k_step:k_step].T  # B[k, n]: rows k_step apart, columns kc*.. apart
        full, rest = divmod(nc, nr)
        w = -(-rest // lanes) * lanes
        dst = np.full(full * nr * kc + w * kc, np.nan, np.float32)
        module.pack_b(kc, nc, w_rows.ctypes.data, k_step, w_rows.shape[1], dst.ctypes.data)
        want = [b[:, p * nr:(p + 1) * nr].ravel() for p in range(full)]
        if rest:
            want.append(np.pad(b[:, full * nr:nc], ((0, 0), (0, w - rest))).ravel())
        np.testing.assert_array_equal(dst, np.concatenate(want))
