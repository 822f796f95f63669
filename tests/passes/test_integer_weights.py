"""integer-weights: a matmul of a float cast of constant int8 codes (torchao's int8 weight-only
layers, as the frontend lowers them) becomes x @ dequantize(codes, per-channel scales), run by
the weight-only GEMM; compared with float64 NumPy on the same codes and scales."""

from __future__ import annotations

import numpy as np
import pytest

import tilefold as tf
from tests.tolerances import assert_close
from tilefold.ir import Builder, interpret
from tilefold.passes import PassManager

RNG = np.random.default_rng(17)


def _codes(shape) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


def _torchao_layer(q: np.ndarray, s: np.ndarray | None, k: int, rows=(3,), bias=True,
                   scale_shape=None):
    """x @ cast(q.T) (* s) (+ bias): q [N, K] codes as torchao stores them, s [N, 1]."""
    b = Builder("main")
    x = b.arg("x", "f32", (*rows, k))
    w = b.op("cast", b.op("transpose", b.constant(q), perm=[1, 0]), dtype="f32")
    y = b.op("matmul", x, w)
    if s is not None:
        y = b.op("mul", y, b.op("reshape", b.constant(s), shape=scale_shape or [q.shape[0]]))
    if bias:
        y = b.op("add", y, b.constant(RNG.standard_normal(q.shape[0]).astype(np.float32)))
    return b.build(y)


def _ops(module) -> list[str]:
    return [op.name for op in module.walk()]


def test_the_cast_and_the_column_scale_become_one_dequantize():
    q, s = _codes((96, 64)), RNG.uniform(0.001, 0.01, (96, 1)).astype(np.float32)
    module = _torchao_layer(q, s, 64)
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    (before,) = interpret(module, x)
    pm = PassManager("integer-weights{min-elements=1024},dce")
    after = pm.run(module)
    assert pm.passes[0].stats == {"num-rewritten": 1}
    names = _ops(after)
    assert "dequantize" in names and "cast" not in names and "mul" not in names
    (deq,) = [op for op in after.walk() if op.name == "dequantize"]
    codes = deq.operands[0].defining_op.attrs["value"]
    assert codes.dtype == np.int8 and np.array_equal(codes, q)  # the codes, as stored
    assert np.array_equal(deq.operands[1].defining_op.attrs["value"], s)
    (got,) = interpret(after, x)
    bias = before.astype(np.float64) - x.astype(np.float64) @ (q.astype(np.float64) * s).T
    size = np.abs(x.astype(np.float64)) @ np.abs(q.astype(np.float64) * s).T
    assert_close(got, before.astype(np.float64), dtype="f32", reduced=64, scale=size + bias)


@pytest.mark.parametrize("case", ["no scale", "scale by row", "u8 codes", "small", "matrix"])
def test_what_is_not_a_per_channel_scale_keeps_its_own_op(case):
    q = _codes((96, 64))
    s = RNG.uniform(0.5, 2.0, (96, 1)).astype(np.float32)
    if case == "no scale":  # a unit scale; the add stays the epilogue
        module, want = _torchao_layer(q, None, 64), 1
    elif case == "scale by row":  # [3, 1] scales rows of x @ w, not columns
        module, want = _torchao_layer(q, s[:3], 64, scale_shape=[3, 1]), 1
    elif case == "u8 codes":
        module, want = _torchao_layer(q.view(np.uint8), s, 64), 0
    elif case == "small":
        module, want = _torchao_layer(_codes((8, 64)), s[:8], 64), 0
    else:  # a [K, N] weight cast without a transpose: transpose_b stays false
        b = Builder("main")
        x = b.arg("x", "f32", (2, 96))
        module, want = b.build(b.op("matmul", x, b.op("cast", b.constant(q), dtype="f32"))), 1
    x = RNG.standard_normal((2, 96) if case == "matrix" else (3, 64)).astype(np.float32)
    (before,) = interpret(module, x)
    pm = PassManager("integer-weights{min-elements=1024},dce")
    after = pm.run(module)
    assert pm.passes[0].stats == {"num-rewritten": want}
    if case == "scale by row":
        assert "mul" in _ops(after)  # the row scale is still applied after the GEMM
    (got,) = interpret(after, x)
    # terms of at most |x| * 128 * 2 (codes times the largest scale) each, plus the bias
    size = np.abs(x.astype(np.float64)).sum(axis=1, keepdims=True) * 256 + 8
    assert_close(got, before.astype(np.float64), dtype="f32", reduced=96, scale=size)


@pytest.mark.parametrize("m", [1, 5])
def test_compiled_int8_codes_run_the_weight_only_gemm(m):
    n, k = 160, 98
    q, s = _codes((n, k)), RNG.uniform(0.001, 0.01, (n, 1)).astype(np.float32)
    graph = tf.compile(_torchao_layer(q, s, k, rows=(m,), bias=False), strict=True)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    (got,) = graph(x)
    (d,) = graph.decisions((m, k))
    assert d.winner.method == "blocks.gemm" and d.winner.config["weights"] == "i8"
    w = q.astype(np.float64) * s
    assert_close(got, x.astype(np.float64) @ w.T, dtype="f32", reduced=k,
                 scale=np.abs(x.astype(np.float64)) @ np.abs(w.T))


def _grouped_layer(q, s, z, k: int, rows=(3,)):
    """x @ reshape((cast(q) - cast(z)) * s).T as torchao's IntxWeightOnlyConfig lowers: q [N, K]
    codes, s and z [N, G] viewed as [N, G, 1]."""
    n, groups = s.shape
    b = Builder("main")
    x = b.arg("x", "f32", (*rows, k))
    codes = b.op("cast", b.op("reshape", b.constant(q), shape=[n, groups, k // groups]),
                 dtype="f32")
    if z is not None:
        codes = b.op("sub", codes, b.op("cast", b.op("reshape", b.constant(z),
                                                      shape=[n, groups, 1]), dtype="f32"))
    w = b.op("reshape", b.op("mul", codes, b.op("reshape", b.constant(s), shape=[n, groups, 1])),
             shape=[n, k])
    return b.build(b.op("matmul", x, b.op("transpose", w, perm=[1, 0])))


@pytest.mark.parametrize(("codes", "zero", "want"), [
    ((-8, 8), "nonzero", "i4"), ((-8, 8), "zeros", "i4"), ((-8, 8), None, "i4"),
    ((-128, 128), None, "i8"), ((-128, 128), "nonzero", None)])
def test_group_wise_codes_become_one_dequantize(codes, zero, want):
    n, k, g = 96, 128, 32
    q = RNG.integers(*codes, (n, k)).astype(np.int8)
    s = RNG.uniform(0.01, 0.1, (n, k // g)).astype(np.float32)
    z = {"nonzero": RNG.integers(-8, 8, (n, k // g)).astype(np.int8),
         "zeros": np.zeros((n, k // g), np.int8), None: None}[zero]
    module = _grouped_layer(q, s, z, k)
    x = RNG.standard_normal((3, k)).astype(np.float32)
    pm = PassManager("integer-weights{min-elements=1024},dce")
    after = pm.run(module)
    assert pm.passes[0].stats == {"num-rewritten": int(want is not None)}
    w = (q.astype(np.float64) - (0 if z is None else np.repeat(z, g, axis=1))) \
        * np.repeat(s.astype(np.float64), g, axis=1)
    (got,) = interpret(after, x)
    assert_close(got, x.astype(np.float64) @ w.T, dtype="f32", reduced=k,
                 scale=np.abs(x.astype(np.float64)) @ np.abs(w.T))
    if want is None:
        return
    (deq,) = [op for op in after.walk() if op.name == "dequantize"]
    assert str(deq.operands[0].type.dtype) == want
    assert len(deq.operands) == (3 if zero == "nonzero" else 2)  # all-zero points dropped
    graph = tf.compile(after, strict=True)
    (d,) = graph.decisions((3, k))
    assert d.winner.method == "blocks.gemm" and d.winner.config["weights"] == want
    assert_close(graph(x)[0], x.astype(np.float64) @ w.T, dtype="f32", reduced=k,
                 scale=np.abs(x.astype(np.float64)) @ np.abs(w.T))
