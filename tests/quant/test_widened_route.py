"""Which bf16/f16 GEMM runs: the registry sends AVX2-only targets to the f32 GEMM with widening
packing and keeps the dot units (AVX512-BF16, AMX) where a chip has them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.lowp.kernels import select_dot_kernel
from tilefold.quant import matmul_lowp, prepack_lowp
from tilefold.quant.api import widened_source
from tilefold.target import host_target, named_target

V3 = host_target("x86-64-v3")
FLOATS = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def test_avx2_targets_widen_and_dot_units_stay():
    for kind, dt in FLOATS.items():
        chosen = select_dot_kernel(V3, kind)
        assert chosen.widens, chosen.name
        assert widened_source(dt, dt, V3) == kind
    assert not select_dot_kernel(V3, "u8s8").widens
    assert widened_source(np.uint8, np.int8, V3) is None
    assert widened_source(ml_dtypes.bfloat16, np.float16, V3) is None
    assert select_dot_kernel(named_target("znver4"), "bf16").dot == "dpbf16"
    assert widened_source(ml_dtypes.bfloat16, ml_dtypes.bfloat16, named_target("znver4")) is None
    assert select_dot_kernel(named_target("sapphirerapids"), "bf16").is_amx
    assert widened_source(np.float16, np.float16, named_target("generic")) is None


@pytest.mark.parametrize("kind", sorted(FLOATS))
@pytest.mark.parametrize(("lead", "m", "k", "n"), [((), 1, 1, 1), ((), 37, 263, 1),
                                                   ((2, 3), 11, 97, 29), ((), 96, 96, 96)])
def test_matmul_lowp_on_avx2_runs_the_f32_gemm(rng, kind, lead, m, k, n):
    a = rng.standard_normal((*lead, m, k)).astype(FLOATS[kind])
    b = rng.standard_normal((k, n)).astype(FLOATS[kind])
    packed = prepack_lowp(b, kind, target=V3)
    assert isinstance(packed.matrix, PackedMatrix) and packed.matrix.module.src == kind
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for c in (matmul_lowp(a, b, target=V3), matmul_lowp(a, packed, target=V3)):
        assert c.dtype == np.float32 and c.shape == (*lead, m, n)
        assert_close(c, a64 @ b64, dtype="f32", reduced=k, scale=np.abs(a64) @ np.abs(b64))


def test_matmul_lowp_strided_b_on_avx2(rng):
    a = rng.standard_normal((19, 40)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((33, 80)).astype(ml_dtypes.bfloat16).T[::2]  # [40, 33], strided
    c = matmul_lowp(a, b, target=V3)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert_close(c, a64 @ b64, dtype="f32", reduced=40, scale=np.abs(a64) @ np.abs(b64))


@pytest.mark.parametrize("kind", sorted(FLOATS))
def test_a_bf16_or_f16_matrix_vector_product_streams_the_weight_as_it_is(rng, kind):
    """M = 1 or N = 1 runs the GEMV on the 2-byte operands, widened as they are loaded (half
    an f32 weight's bytes): both forms (W contiguous along the outputs, or along K), tails of
    every length, two threads on a weight past the parallel threshold, and a pre-packed weight,
    which then never builds the f32 GEMM's panels; results match float64 NumPy."""
    from tilefold.codegen.llvm.gemm.plan import GemvPlan, make_plan
    from tilefold.codegen.llvm.lowp.widened import widened_module

    dt = FLOATS[kind]
    module = widened_module(select_dot_kernel(V3, kind), V3)
    cases = [((1, 1), (1, 1)), ((1, 263), (263, 37)), ((1, 97), (97, 4099)),
             ((29, 301), (301, 1)), ((1, 1000), (1000, 3000))]
    for a_shape, b_shape in cases:
        a = rng.standard_normal(a_shape).astype(dt)
        b = rng.standard_normal(b_shape).astype(dt)
        for bb in (b, np.asfortranarray(b)):  # W contiguous along N (axpy) or along K (dot)
            c = np.empty((a_shape[0], b_shape[1]), np.float32)
            assert isinstance(make_plan(module, a, bb, c, 0, 2), GemvPlan)
            a64, b64 = a.astype(np.float64), bb.astype(np.float64)
            for threads in (1, 2):
                got = matmul_lowp(a, bb, target=V3, threads=threads)
                assert_close(got, a64 @ b64, dtype="f32", reduced=a_shape[1],
                             scale=np.abs(a64) @ np.abs(b64))
        packed = prepack_lowp(b, kind, target=V3)
        got = matmul_lowp(a, packed, target=V3)
        assert_close(got, a64 @ b64, dtype="f32", reduced=a_shape[1],
                     scale=np.abs(a64) @ np.abs(b64))
        assert "matrix" not in vars(packed)  # no f32 panels for a matrix-vector product
