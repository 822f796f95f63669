"""Bad input to tilefold.matmul/prepack raises a TilefoldError naming the op and what to do."""

from __future__ import annotations

import numpy as np
import pytest

import tilefold.linalg as tl
from tilefold.errors import DTypeError, ShapeError, TilefoldError, UnsupportedError

F = np.float32


def z(*shape, dtype=F):
    return np.zeros(shape, dtype)


@pytest.mark.parametrize("a, b, match", [
    (z(3, 4), z(5, 6), "contraction sizes differ"),
    (z(4), z(5), "contraction sizes differ"),
    (z(2, 3, 4), z(3, 4, 5), "do not broadcast"),
    (np.float32(1), z(3), "at least 1 dimension"),
    (z(3, 4, dtype=np.float64), z(5, 6, dtype=np.float64), "contraction sizes differ"),
])
def test_shape_errors(a, b, match):
    with pytest.raises(ShapeError, match=match) as info:
        tl.matmul(a, b)
    assert "matmul" in str(info.value)


def test_non_numeric_dtype():
    with pytest.raises(DTypeError, match="no kernel for dtypes"):
        tl.matmul(np.array([["a"]]), np.array([["b"]]))


@pytest.mark.parametrize("out, error, match", [
    (z(3, 6), ShapeError, "out has shape"),
    (z(3, 5, dtype=np.float64), DTypeError, "out must be float32"),
    ([[0.0] * 5] * 3, DTypeError, "out must be a NumPy array"),
])
def test_bad_out(out, error, match):
    with pytest.raises(error, match=match):
        tl.matmul(z(3, 4), z(4, 5), out=out)


def test_read_only_out():
    out = z(3, 5)
    out.flags.writeable = False
    with pytest.raises(UnsupportedError, match="read-only"):
        tl.matmul(z(3, 4), z(4, 5), out=out)


@pytest.mark.parametrize("which", ["a", "b"])
def test_out_aliasing_an_input(which):
    buf = np.ones((6, 6), F)
    a, b = (buf, np.ones((6, 6), F)) if which == "a" else (np.ones((6, 6), F), buf)
    with pytest.raises(UnsupportedError, match="shares memory"):
        tl.matmul(a, b, out=buf)


def test_unallocatable_result():
    a = np.lib.stride_tricks.as_strided(z(1), (1 << 24, 1), (0, 4))
    b = np.lib.stride_tricks.as_strided(z(1), (1, 1 << 24), (4, 0))
    with pytest.raises(ShapeError, match="cannot be allocated"):
        tl.matmul(a, b)


def test_prepack_errors():
    with pytest.raises(ShapeError, match="2-D"):
        tl.prepack(z(2, 3, 4))
    with pytest.raises(DTypeError, match="float32"):
        tl.prepack(z(3, 4, dtype=np.float64))
    packed = tl.prepack(z(4, 5))
    with pytest.raises(ShapeError, match="contraction"):
        tl.matmul(z(3, 7), packed)
    with pytest.raises(DTypeError, match="pre-packed"):
        tl.matmul(z(3, 4, dtype=np.float64), packed)


def test_errors_are_tilefold_errors():
    assert issubclass(ShapeError, TilefoldError) and issubclass(DTypeError, TilefoldError)
