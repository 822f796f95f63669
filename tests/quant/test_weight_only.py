"""Weight-only matmul (int4/fp4/fp8/int8 codes decoded in registers) against the float64
reference of the dequantized math, on the host kernels and every forced fallback."""

from __future__ import annotations

import numpy as np
import pytest

from tests.quant.levels import LEVELS, target_for
from tilefold.codegen.lowp.decode import choose_decoder, octet_packed
from tilefold.quant import dequantize, quantize, quantized_matmul
from tilefold.quant.accuracy import matmul_bound

CASES = [("int4", {}), ("int4", {"symmetric": False}), ("fp4", {}), ("fp8", {}),
         ("fp8", {"group_size": 32}), ("int8", {}), ("int8", {"symmetric": False})]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("fmt", "kw"), CASES)
def test_matches_dequantized_reference(rng, level, fmt, kw):
    target = target_for(level)
    k, n = 192, 70
    qw = quantize(rng.standard_normal((k, n)).astype(np.float32), fmt, **kw)
    w = dequantize(qw, "f64")
    for m in (1, 2, 5, 8, 11):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = quantized_matmul(x, qw, target=target)
        assert y.shape == (m, n) and y.dtype == np.float32
        assert (np.abs(y - x.astype(np.float64) @ w) <= matmul_bound(x, w)).all()


def test_fallback_decoders_are_chosen_without_avx512():
    v3 = target_for("x86-64-v3")
    assert choose_decoder("i4", v3).method == "sext4"
    assert choose_decoder("fp4e2m1", v3).method == "minifloat"
    host = target_for("host")
    assert choose_decoder("i4", host).method == ("lut" if host.has("avx512f") else "sext4")


@pytest.mark.parametrize("kw, group, method", [
    ({}, 32, "offset4"),                    # octets, symmetric: codes + 8, masked in place
    ({}, 6, "sext4"),                       # k-pairs: groups of 6 are not whole octets
    ({"symmetric": False}, 32, "sext4"),    # its own zero points
])
def test_avx2_int4_decoders_and_extreme_codes(rng, kw, group, method):
    """On AVX2 each layout gets its decoder; codes at -8 and 7 (and all between) against
    float64 NumPy, x spanning magnitudes, M of 1 and 3."""
    v3 = target_for("x86-64-v3")
    w = rng.choice([-8.0, -1.0, 0.0, 3.0, 7.0], (96, 40)) * rng.uniform(0.5, 2, (1, 40))
    qw = quantize(w.astype(np.float32), "int4", group_size=group, **kw)
    dq = dequantize(qw, "f64")
    from tilefold.codegen.lowp.weight_only import panel_layout

    assert panel_layout(qw, v3).decoder.method == method
    for m in (1, 3):
        x = (rng.standard_normal((m, 96)) * 10.0 ** rng.integers(-3, 4, (m, 96)))
        x = x.astype(np.float32)
        y = quantized_matmul(x, qw, target=v3)
        assert (np.abs(y - x.astype(np.float64) @ dq) <= matmul_bound(x, dq)).all()


def test_torch_layout_contracts_axis_one(rng):
    w = rng.standard_normal((48, 256)).astype(np.float32)  # [N, K] like nn.Linear.weight
    qw = quantize(w, "int4", group_size=64, axis=1)
    x = rng.standard_normal((3, 4, 256)).astype(np.float32)
    y = quantized_matmul(x, qw)
    ref = x.astype(np.float64) @ dequantize(qw, "f64").T
    assert y.shape == (3, 4, 48)
    assert (np.abs(y - ref) <= matmul_bound(x, dequantize(qw, "f64").T)).all()


def test_bf16_activations_and_threads_agree(rng):
    import ml_dtypes

    qw = quantize(rng.standard_normal((512, 300)).astype(np.float32), "int4")
    x = rng.standard_normal((1, 512)).astype(ml_dtypes.bfloat16)
    one = quantized_matmul(x, qw, threads=1)
    two = quantized_matmul(x, qw, threads=2)
    assert np.array_equal(one, two)
    w = dequantize(qw, "f64")
    assert (np.abs(one - x.astype(np.float64) @ w) <= matmul_bound(x, w)).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("k", "group"), [(64, 8), (80, 16), (256, 64), (96, 6), (192, 32)])
@pytest.mark.parametrize(("fmt", "kw"), [("int4", {}), ("int4", {"symmetric": False}),
                                         ("fp4", {})])
def test_nibble_packings_match_reference(rng, level, k, group, fmt, kw):
    """Octet-packed panels (AVX-512, group % 8 == 0) and k-pair panels (group 6, AVX2) for odd N,
    several K and group sizes, M = 1..8."""
    target = target_for(level)
    n = 37
    qw = quantize(rng.standard_normal((k, n)).astype(np.float32), fmt, group_size=group, **kw)
    w = dequantize(qw, "f64")
    for m in range(1, 9):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = quantized_matmul(x, qw, target=target)
        assert y.shape == (m, n)
        assert (np.abs(y - x.astype(np.float64) @ w) <= matmul_bound(x, w)).all()


def test_octet_packing_is_chosen_for_nibbles_in_groups_of_8():
    """AVX-512 (16 lanes) and AVX2 (8) alike; groups of 6 and byte codes keep k-pairs."""
    assert octet_packed(16, 32, True) and octet_packed(8, 32, True)
    assert not octet_packed(16, 6, True) and not octet_packed(8, 32, False)


@pytest.mark.parametrize("kw", [{}, {"symmetric": False}])
def test_kept_plans_follow_new_activations_and_threads(rng, kw):
    """A plan kept on the weight serves new x (and, with zero points, new row sums of x)."""
    qw = quantize(rng.standard_normal((256, 50)).astype(np.float32), "int4", **kw)
    w = dequantize(qw, "f64")
    for threads in (1, 2, 1):
        for _ in range(2):
            x = rng.standard_normal((3, 256)).astype(np.float32)
            y = quantized_matmul(x, qw, threads=threads)
            assert (np.abs(y - x.astype(np.float64) @ w) <= matmul_bound(x, w)).all()
