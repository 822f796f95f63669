"""Plan shapes that change no answer but the speed: batch dims folded into M where B is shared
and the rows follow one another, and a K barely over KC run as one K block."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.codegen.gemm.blocking import derive_blocking
from tilefold.codegen.llvm.gemm.driver import Param
from tilefold.codegen.llvm.gemm.gemv import GemvParam
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import ONE_K_BLOCK_SLACK, GemmPlan, k_block, make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.target import host_target, named_target


def _operands(rng, a_shape, b_shape):
    return (rng.standard_normal(a_shape, dtype=np.float32),
            rng.standard_normal(b_shape, dtype=np.float32))


# (A, B, batch entries left after folding, rows per entry)
FOLDS = [
    ((8, 128, 96), (96, 200), 1, 1024),       # a model's activations @ a weight
    ((2, 3, 5, 7), (7, 11), 1, 30),           # every batch dim folds
    ((2, 3, 17, 40), (1, 40, 9), 1, 102),     # B's size-1 batch dim is shared too
    ((4, 1, 64), (64, 33), 1, 4),             # rows of one: a 4-row product, not 4 GEMVs
    ((6, 10, 1), (1, 5), 1, 60),              # K = 1
    ((3, 17, 40), (40, 1), 1, 51),            # N = 1: one matrix-vector product
    ((2, 3, 5, 7), (3, 7, 11), 6, 5),         # B differs per entry: nothing folds
    ((2, 1, 5, 7), (3, 7, 11), 6, 5),         # A broadcast over B's entries
    ((3, 4, 5, 7), (3, 1, 7, 11), 3, 20),     # the inner dim folds, the outer B dim stays
]


@pytest.mark.parametrize("a_shape, b_shape, entries, rows", FOLDS)
@pytest.mark.parametrize("threads", [1, 2])
def test_shared_b_folds_batch_dims_into_rows(a_shape, b_shape, entries, rows, threads):
    module = gemm_module(host_target())
    rng = np.random.default_rng(sum(a_shape) * 7 + sum(b_shape))
    a, b = _operands(rng, a_shape, b_shape)
    c = np.full(np.matmul(a, b).shape, np.nan, np.float32)
    plan = make_plan(module, a, b, c, 0, threads)
    if isinstance(plan, GemmPlan):
        assert (len(plan.offsets), plan.params[Param.M]) == (entries, rows)
    else:  # a matrix-vector product over all the folded rows
        assert entries == 1 and rows in (plan.params[GemvParam.N_OUT], 1)
    plan(a, b, c)
    check_matmul(c, a, b)


@pytest.mark.parametrize("layout", ["batch_transposed", "rows_sliced", "c_strided"])
def test_rows_that_do_not_follow_one_another_keep_their_entries(layout):
    """A's batch entries apart by more than their rows (a transposed or sliced view), or C's:
    the entries stay separate products, and the answer is the same."""
    module = gemm_module(host_target())
    rng = np.random.default_rng(5)
    b = rng.standard_normal((96, 50), dtype=np.float32)
    a = rng.standard_normal((8, 128, 96), dtype=np.float32)
    c = np.full((8, 128, 50), np.nan, np.float32)
    if layout == "batch_transposed":
        a = rng.standard_normal((128, 8, 96), dtype=np.float32).transpose(1, 0, 2)
    elif layout == "rows_sliced":
        a = rng.standard_normal((8, 130, 96), dtype=np.float32)[:, :128]
    else:
        c = np.full((8, 130, 50), np.nan, np.float32)[:, :128]
    plan = make_plan(module, a, b, c, 0, 2)
    assert (len(plan.offsets), plan.params[Param.M]) == (8, 128)
    plan(a, b, c)
    check_matmul(c, a, b)


def test_prepacked_b_folds_too():
    module = gemm_module(host_target())
    rng = np.random.default_rng(9)
    a, b = _operands(rng, (4, 50, 70), (70, 60))
    packed = PackedMatrix(b, module)
    c = np.full((4, 50, 60), np.nan, np.float32)
    plan = make_plan(module, a, packed, c, 0, 2)
    assert (len(plan.offsets), plan.params[Param.M]) == (1, 200)
    plan(a, packed.data, c)
    check_matmul(c, a, b)


def _a_in_l1_kernel():
    """The x86-64-v4 target and its micro-kernel, whose tile keeps A's micro-panel in L1."""
    target = named_target("x86-64-v4")
    kernel = select_microkernel(target)
    assert kernel.a_in_l1
    return target, kernel


def _a_in_l1_module():
    """The AVX-512 module of that kernel; run only if the host can."""
    return gemm_module(*_a_in_l1_kernel())


def _a_in_l1_kernel_and_kc():
    """The A-in-L1 kernel and its one-thread KC: planned on every host."""
    target, kernel = _a_in_l1_kernel()
    return kernel, derive_blocking(target, kernel, 1).kc


@pytest.mark.parametrize("over", [1.0, 1.25, ONE_K_BLOCK_SLACK])
def test_a_k_barely_over_kc_runs_as_one_block(over):
    kernel, kc = _a_in_l1_kernel_and_kc()
    k = int(kc * over) - 1  # not a multiple of 4: the block rounds it up
    assert k_block(kernel, k, kc) == -(-k // 4) * 4


def test_a_longer_k_keeps_balanced_blocks_of_at_most_kc():
    kernel, kc = _a_in_l1_kernel_and_kc()
    k = int(kc * ONE_K_BLOCK_SLACK) + 4
    got = k_block(kernel, k, kc)
    assert got <= kc and -(-k // got) == 2


def test_kernels_streaming_a_keep_blocks_of_at_most_kc():
    target = named_target("x86-64-v3")
    kernel = select_microkernel(target)
    kc = derive_blocking(target, kernel, 1).kc
    assert not kernel.a_in_l1
    got = k_block(kernel, kc + 4, kc)
    assert got <= kc and -(-(kc + 4) // got) == 2


@pytest.mark.skipif(not host_target().has("avx512f"), reason="the host cannot run AVX-512")
def test_one_k_block_computes_the_product():
    module = _a_in_l1_module()
    k = int(derive_blocking(module.target, module.kernel, 2).kc * ONE_K_BLOCK_SLACK)
    rng = np.random.default_rng(11)
    a, b = _operands(rng, (130, k), (k, 200))
    c = np.full((130, 200), np.nan, np.float32)
    plan = make_plan(module, a, b, c, 0, 2)
    plan(a, b, c)
    check_matmul(c, a, b)
