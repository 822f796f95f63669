"""Formats: quantize/dequantize round trips within the documented bounds, packing, the IR ops."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold import dtypes
from tilefold.ir.ops.quant import Dequantize, Quantize
from tilefold.quant import FORMATS, dequantize, quantize
from tilefold.quant.accuracy import quantization_bound
from tilefold.quant.packing import pack_nibbles, unpack_nibbles

SCHEMES = [
    ("int8", {}), ("int8", {"symmetric": False}), ("int8", {"per_tensor": True}),
    ("int8", {"group_size": 64}), ("int4", {"group_size": 32}), ("int4", {"group_size": 64}),
    ("int4", {"group_size": 128, "symmetric": False}), ("int4", {"group_size": None}),
    ("fp8", {}), ("fp8", {"group_size": 32}), ("fp4", {"group_size": 32}),
    ("fp4", {"per_tensor": True}),
]


@pytest.mark.parametrize(("fmt", "kw"), SCHEMES)
@pytest.mark.parametrize("axis", [0, 1])
def test_round_trip_within_bound(rng, fmt, kw, axis):
    w = (rng.standard_normal((256, 128)) * rng.uniform(0.01, 10, (1, 128))).astype(np.float32)
    qt = quantize(w, fmt, axis=axis, **kw)
    assert qt.axis == axis and qt.shape == w.shape
    err = np.abs(dequantize(qt, "f64") - w)
    assert (err <= quantization_bound(w, qt)).all()


def test_scale_shapes_say_the_granularity(rng):
    w = rng.standard_normal((128, 16)).astype(np.float32)
    assert quantize(w, "int4", group_size=32).scale.shape == (4, 16)
    assert quantize(w, "int8").scale.shape == (1, 16)
    assert quantize(w, "int8", per_tensor=True).scale.shape == (1, 1)
    assert quantize(w, "int4", group_size=8, axis=1).scale.shape == (128, 2)
    assert quantize(w, "int4").group_size == 32


def test_four_bit_storage_is_two_per_byte(rng):
    w = rng.standard_normal((64, 8)).astype(np.float32)
    for fmt in ("int4", "fp4"):
        qt = quantize(w, fmt)
        assert qt.data.dtype == np.uint8 and qt.data.shape == (32, 8)
        assert qt.nbytes == 32 * 8 + qt.scale.nbytes


def test_nibble_packing_round_trips(rng):
    codes = rng.integers(-8, 8, (6, 10)).astype(dtypes.i4.np_dtype)
    for axis in (0, 1):
        back = unpack_nibbles(pack_nibbles(codes, axis), axis, dtypes.i4)
        assert (back == codes).all()


def test_all_zero_block_gets_scale_one():
    qt = quantize(np.zeros((64, 4), np.float32), "int4")
    assert (qt.scale == 1).all() and (dequantize(qt) == 0).all()


def test_extremes_hit_the_largest_code(rng):
    w = rng.standard_normal((32, 4)).astype(np.float32)
    for name, fmt in FORMATS.items():
        codes = quantize(w, name, group_size=32).codes().astype(np.float64)
        assert np.isclose(np.abs(codes).max(axis=0), fmt.qmax).all()


def test_ir_ops_define_the_math(rng):
    w = rng.standard_normal((64, 8)).astype(np.float32)
    qt = quantize(w, "int4", group_size=32, symmetric=False)
    codes = Quantize.reference([w, qt.scale, qt.zero_point], {"dtype": dtypes.i4})
    assert (codes == qt.codes()).all()
    back = Dequantize.reference([codes, qt.scale, qt.zero_point], {"dtype": dtypes.f32})
    assert (back == dequantize(qt)).all()


def test_ir_ops_infer_types():
    from tilefold.ir.types import TensorType

    x, s = TensorType.of("f32", (64, 8)), TensorType.of("f32", (2, 8))
    attrs = Quantize.full_attrs({"dtype": dtypes.fp4e2m1})
    (q,) = Quantize.infer([x, s], attrs)
    assert q == TensorType.of("fp4e2m1", (64, 8))
    (y,) = Dequantize.infer([q, s], Dequantize.full_attrs({}))
    assert y == TensorType.of("f32", (64, 8))


def test_fp_codes_saturate_instead_of_overflowing():
    x = np.array([[1e6, -1e6]], np.float64)
    q = Quantize.reference([x, np.ones((1, 1), np.float32)], {"dtype": dtypes.fp8e4m3})
    assert q.astype(np.float64).tolist() == [[448.0, -448.0]]
