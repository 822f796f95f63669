"""How 2 threads split one GEMM: even parts over M or N, never a whole extra micro-panel."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.llvm.gemm.driver import BMode
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import _parts, make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.target import host_target, named_target


def _runnable(name):
    """The ISA level `name` as a test parameter, skipped where this machine cannot run it."""
    target = named_target(name)
    reason = f"this host ({host_target().name}) cannot run {name} code"
    return pytest.param(target, id=name, marks=pytest.mark.skipif(not target.is_host(),
                                                                  reason=reason))


@pytest.fixture(scope="module", params=[_runnable("x86-64-v4"), _runnable("x86-64-v3")])
def module(request):
    """Each x86 level's own micro-kernel (8x48 on AVX-512, 6x16 on AVX2): plans fetch the entry
    point, so only levels the host runs are planned."""
    return gemm_module(request.param, select_microkernel(request.param))


@pytest.fixture(scope="module")
def host_module():
    target = host_target()
    return gemm_module(target, select_microkernel(target))


def _split_of(module, m, n, k, packed=False):
    a = np.ones((m, k), np.float32)
    b = np.ones((k, n), np.float32)
    c = np.empty((m, n), np.float32)
    return make_plan(module, a, PackedMatrix(b, module) if packed else b, c, 0, 2)


def test_parts_match_driver_split():
    assert _parts(768, 2, 48) == [384, 384]
    assert _parts(128, 2, 8) == [64, 64]
    assert _parts(512, 2, 16) == [256, 256]
    assert _parts(1000, 2, 16) == [496, 504]
    assert _parts(100, 3, 16) == [32, 32, 36]
    assert sum(_parts(8192, 2, 28)) == 8192


@pytest.mark.parametrize("m, n, k", [(128, 768, 768), (128, 128, 128), (256, 256, 256),
                                     (512, 512, 512), (1024, 1024, 1024), (50, 512, 768),
                                     (32, 4096, 4096), (1000, 1000, 1000)])
def test_two_threads_get_even_work(module, m, n, k):
    plan = _split_of(module, m, n, k)
    tm, tn = plan.split
    assert tm * tn == 2
    kern = plan.kernel
    rows = _parts(m, tm, kern.mr)
    cols = _parts(n, tn, plan.params[20])
    work = [r * c for r in rows for c in cols]
    # Within one vector of columns (or one row tile) of an even split.
    assert max(work) - min(work) <= max(kern.lanes * max(rows), kern.mr * max(cols))


def test_prepacked_b_splits_in_whole_panels(module):
    plan = _split_of(module, 128, 512, 256, packed=True)
    assert plan.bmode == BMode.PREPACKED
    assert plan.params[20] == plan.kernel.nr


@pytest.mark.parametrize("m, n, k", [(128, 128, 128), (256, 256, 256), (64, 512, 96),
                                     (40, 1000, 70), (97, 1531, 33), (130, 144, 17),
                                     (3, 200, 64)])
@pytest.mark.parametrize("packed", [False, True])
def test_two_thread_results(host_module, m, n, k, packed):
    """Every element written once, by parts cut in vector (or, pre-packed, panel) units."""
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    b_arg = PackedMatrix(b, host_module) if packed else b
    for beta, fill in ((0, np.nan), (1, 0.0)):
        c = np.full((m, n), fill, np.float32)
        plan = make_plan(host_module, a, b_arg, c, beta, 2)
        plan(a, b_arg.data if packed else b, c)
        check_matmul(c, a, b)
