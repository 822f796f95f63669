"""Bad input: every mistake is a TilefoldError naming the op and saying what to do."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tilefold.errors import DTypeError, ShapeError, TilefoldError, UnsupportedError
from tilefold.ir.ops.quant import Dequantize, ScaleError
from tilefold.quant import QuantizedTensor, matmul_lowp, quantize, quantized_matmul
from tilefold.quant.formats import get_format

W = np.ones((64, 8), np.float32)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_bad_scales(bad):
    qt = quantize(W, "int4")
    scale = qt.scale.copy()
    scale[1, 3] = bad
    with pytest.raises(ScaleError, match=r"scale\[1, 3\].*must be finite"):
        QuantizedTensor(qt.format, qt.shape, 0, qt.data, scale)
    with pytest.raises(ScaleError, match=r"offset\[1, 3\].*must be finite"):
        QuantizedTensor(qt.format, qt.shape, 0, qt.data, qt.scale, offset=scale)
    with pytest.raises(ScaleError, match="dequantize"):
        Dequantize.reference([qt.codes(), scale], {"dtype": qt.code})


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_zero_and_negative_scales_hold_stored_blocks(value):
    """A stored weight may have them (GGUF's Q4_0 keeps the sign of a block's largest value in
    its scale; an all-zero block has scale 0); the IR's quantize/dequantize ops still refuse
    them (quantizing divides by the scale)."""
    qt = quantize(W, "int4")
    scale = qt.scale.copy()
    scale[1, 3] = value
    stored = QuantizedTensor(qt.format, qt.shape, 0, qt.data, scale)
    want = qt.codes().astype(np.float64) * np.repeat(scale, 32, axis=0)
    assert np.array_equal(stored.dequantize("f64"), want)
    with pytest.raises(ScaleError, match="finite and > 0"):
        Dequantize.reference([qt.codes(), scale], {"dtype": qt.code})


def test_group_must_divide_k():
    with pytest.raises(ShapeError, match="group_size 48 does not divide the length 64"):
        quantize(W, "int4", group_size=48)


def test_odd_k_for_four_bit():
    with pytest.raises(ShapeError, match="must be even"):
        quantize(np.ones((63, 8), np.float32), "int4", per_tensor=True)
    with pytest.raises(ShapeError, match="odd length"):
        QuantizedTensor.from_codes("int4", np.zeros((63, 2), ml_dtypes.int4), 0,
                                   np.ones((1, 2), np.float32))


def test_mismatched_scale_shape():
    qt = quantize(W, "int4")
    with pytest.raises(ShapeError, match="does not tile data shape"):
        QuantizedTensor(qt.format, qt.shape, 0, qt.data, np.ones((3, 8), np.float32))
    with pytest.raises(ShapeError, match="zero point"):
        QuantizedTensor(qt.format, qt.shape, 0, qt.data, qt.scale, np.zeros((1, 8), np.int8))


def test_symmetric_only_formats_and_unknown_names():
    with pytest.raises(DTypeError, match="symmetric"):
        quantize(W, "fp8", symmetric=False)
    with pytest.raises(DTypeError, match="unknown format 'int3'"):
        get_format("int3")
    with pytest.raises(DTypeError, match="inf or NaN"):
        quantize(np.full((64, 8), np.nan, np.float32), "int8")


def test_dtype_pairs_without_kernels():
    with pytest.raises(DTypeError, match=r"no kernel for u8 x u8.*supported"):
        matmul_lowp(np.ones((2, 4), np.uint8), np.ones((4, 2), np.uint8))
    with pytest.raises(DTypeError, match="must be float"):
        quantized_matmul(np.ones((1, 64), np.int8), quantize(W, "int4"))


def test_shape_mistakes():
    with pytest.raises(ShapeError, match="contraction length is 64"):
        quantized_matmul(np.ones((1, 63), np.float32), quantize(W, "int4"))
    with pytest.raises(ShapeError, match="contraction length"):
        matmul_lowp(np.ones((2, 5), np.int8), np.ones((4, 2), np.int8))


def test_kernel_limits_are_explained():
    from tilefold.codegen.llvm.lowp.weight_only import weight_only_matmul

    qt = quantize(np.ones((66, 4, 2), np.float32), "int8", group_size=33)
    with pytest.raises(UnsupportedError, match="2-D"):
        weight_only_matmul(np.ones((1, 66), np.float32), qt)


def test_every_error_is_a_tilefold_error():
    for cls in (ScaleError, ShapeError, DTypeError, UnsupportedError):
        assert issubclass(cls, TilefoldError)
