"""Whether a plan reads B in place or packs it: in place where packing would be pure overhead
(few row tiles, or a small block whose micro-panel keeps to L1), packed where the panel's rows
would pile onto a few L1 sets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.llvm.gemm.driver import BMode
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import _crowds_l1, choose_bmode, make_plan
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.target import host_target, named_target

KIB = 1024


@pytest.mark.parametrize("l1, rows, row_bytes, panel, crowded", [
    (32 * KIB, 64, 512, 64, True),     # 8 sets x 8 ways hold exactly the 64 rows: no room
    (48 * KIB, 64, 512, 64, False),    # 12 ways leave room for A and C
    (32 * KIB, 64, 768, 64, False),    # 16 sets, 4 rows each
    (32 * KIB, 64, 400, 64, False),    # a stride off the line size spreads over every set
    (32 * KIB, 64, 16 * KIB, 64, True),  # every row on one set
    (48 * KIB, 64, 512, 192, False),   # 3-line rows: 24 sets, 8 lines each of 12 ways
    (48 * KIB, 256, 1024, 192, True),  # 12 sets, 64 lines each
])
def test_crowding_counts_lines_per_l1_set(l1, rows, row_bytes, panel, crowded):
    assert _crowds_l1(l1, rows, row_bytes, panel) is crowded


def _module(l1d_bytes):
    """The AVX2 GEMM module of a target with this L1 (planned, never compiled here)."""
    target = dataclasses.replace(named_target("x86-64-v3"), l1d_bytes=l1d_bytes,
                                 l2_bytes=512 * KIB)
    return gemm_module(target, select_microkernel(target))


@pytest.mark.parametrize("m, n, k, l1, mode", [
    (128, 128, 64, 32 * KIB, BMode.PACK),     # 64 rows of 512 bytes crowd an 8-way L1
    (128, 128, 64, 48 * KIB, BMode.DIRECT),   # not a 12-way one
    (128, 144, 64, 32 * KIB, BMode.DIRECT),   # 576-byte rows spread over every set
    (128, 192, 64, 32 * KIB, BMode.DIRECT),
    (128, 256, 64, 32 * KIB, BMode.PACK),
    (12, 4096, 4096, 32 * KIB, BMode.DIRECT),  # few row tiles: never worth packing
    (512, 144, 64, 32 * KIB, BMode.PACK),     # many row tiles reuse a packed copy
    (128, 1024, 256, 32 * KIB, BMode.PACK),   # a block over 1/8 of L2
])
def test_b_is_read_in_place_only_where_its_panel_keeps_to_l1(m, n, k, l1, mode):
    assert choose_bmode(m, n, k, n, 1, _module(l1), 1) == mode


@pytest.mark.parametrize("batch, m, n, k", [(12, 128, 128, 64), (3, 128, 144, 64),
                                            (2, 128, 256, 64), (1, 97, 192, 61)])
def test_the_chosen_mode_computes_the_product(batch, m, n, k):
    """The host plan's choice, on either side of the rule, against the float64 oracle."""
    target = host_target()
    module = gemm_module(target, select_microkernel(target))
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    c = np.full((batch, m, n), np.nan, np.float32)
    plan = make_plan(module, a, b, c, 0, 1)
    assert plan.bmode in (BMode.PACK, BMode.DIRECT)
    plan(a, b, c)
    check_matmul(c, a, b)
