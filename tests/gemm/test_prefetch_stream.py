"""The micro-kernels' prefetch stream: while a tile computes, it prefetches its share of the
next B panel (pre-packed or read in place) or of the next chunk's source rows (packed per
call). Prefetches never change a result, so what can go wrong is the kernel around them: the
stream's phis, its counter, and the driver's shares at every edge (fewer tiles than the
shares, the last panel, a narrow panel, K shorter than an unrolled step). Each against the
float64 oracle, for every B mode, on the host's streaming kernels (the stream forced on: plans
keep it for B larger than L2 holds)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.gemm.blocking import Blocking
from tilefold.codegen.llvm.gemm import driver
from tilefold.codegen.llvm.gemm.microkernel import emit_microkernel
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import BMode, make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.gemm.registry import MICROKERNELS
from tilefold.target import host_target

STREAMING = [k for k in MICROKERNELS
             if k.dtype == "f32" and k.streams and host_target().has(*k.features)]


def test_only_streaming_kernels_carry_the_stream():
    """The stream is in the main loop of the general kernels' variants (full and tail) and not
    in those reading A in place or keeping A in L1 (their registers are spoken for)."""
    from llvmlite import ir

    assert STREAMING, "every host has a general kernel that streams"
    for kern in MICROKERNELS:
        for mr in kern.m_sizes:
            fn = emit_microkernel(ir.Module(), kern.spec(mr, kern.nv))
            assert ("%pf.at = phi" in fn.text) == kern.streams, (kern.name, mr)
            assert ("prefetch.p0(ptr %pf.at" in fn.text) == kern.streams


@pytest.mark.parametrize("kern", STREAMING, ids=lambda k: k.name)
@pytest.mark.parametrize("bmode", [BMode.PACK, BMode.PREPACKED, BMode.DIRECT],
                         ids=lambda m: m.name)
def test_products_are_exact_across_the_stream_edges(kern, bmode):
    rng = np.random.default_rng(int(bmode) + 7)
    chunk = kern.nr * driver.PACK_PANELS
    module = gemm_module(host_target(), kern)
    # K in two blocks (the last ragged, shorter than the unroll once); N over chunks, NC
    # blocks and a narrow last panel; M from one tile to more tiles than a panel has shares.
    blocking = Blocking(mc=kern.mr * 5, kc=4 * kern.unroll + 2, nc=chunk + 2 * kern.nr)
    for m, n, k, threads, beta in itertools.product(
            (1, kern.mr + 1, 5 * kern.mr, 11 * kern.mr + 3), (kern.nr + 3, 2 * chunk + 5),
            (1, 3, 2 * blocking.kc + 1), (1, 2), (0, 1)):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c0 = rng.standard_normal((m, n), dtype=np.float32)
        c = c0.copy() if beta else np.full((m, n), np.nan, np.float32)
        operand = PackedMatrix(b, module) if bmode == BMode.PREPACKED else b
        plan = make_plan(module, a, operand, c, beta, threads, blocking=blocking,
                         bmode=None if bmode == BMode.PREPACKED else bmode, stream=True)
        assert plan.bmode == bmode and plan.stream
        plan(a, operand.data if bmode == BMode.PREPACKED else b, c)
        if beta:  # C0 + A @ B is the product of [A, I] and [[B], [C0]]
            check_matmul(c, np.hstack([a, np.eye(m, dtype=np.float32)]), np.vstack([b, c0]))
        else:
            check_matmul(c, a, b)


def test_plans_stream_only_b_that_l2_does_not_keep():
    """B that half of L2 holds stays there from call to call; prefetching it only costs."""
    module = gemm_module(host_target(), STREAMING[0])
    l2_floats = module.target.l2_bytes // 4
    for k, n, streams in ((64, l2_floats // 128, False), (64, l2_floats // 64, True)):
        a = np.ones((64, k), np.float32)
        b, c = np.ones((k, n), np.float32), np.empty((64, n), np.float32)
        assert make_plan(module, a, b, c, 0, 1).stream == streams, (k, n)
