"""Which bf16/f16 GEMM runs: the registry sends AVX2-only targets to the f32 GEMM with widening
packing and keeps the dot units (AVX512-BF16, AMX) where a chip has them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold.codegen.gemm.prepack import PackedMatrix
from tilefold.codegen.lowp.kernels import select_dot_kernel
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
