"""merge-matmuls: the merged GEMM computes what the separate ones did (interpreted and through
tf.compile), within fp32's rounding bound for a K-term dot product plus the bias add."""

from __future__ import annotations

import numpy as np
import pytest

import tilefold as tf
from tilefold.ir import Builder
from tilefold.passes import PassManager

K, WIDTHS = 16, (16, 16, 8)


def _projections(weights, biases, transpose_b: bool):
    b = Builder("main")
    x = b.arg("x", "f32", ("n", K))
    outs = []
    for i, w in enumerate(weights):
        y = b.op("matmul", x, b.constant(w.T if transpose_b else w), transpose_b=transpose_b)
        outs.append(y + b.constant(biases[i]) if biases else y)
    return b.build(*outs)


def _check(got: np.ndarray, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> None:
    """|got - (x w + b)| <= gamma_K |x||w| + u (|x||w| + |b|): the dot product's bound
    (tests/gemm/reference.py) and one more rounding for the add."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    b64 = np.zeros(w.shape[1]) if bias is None else bias.astype(np.float64)
    u = np.finfo(np.float32).eps / 2
    gamma = K * u / (1 - K * u) + u
    mag = np.abs(x64) @ np.abs(w64)
    bound = gamma * mag + (u * (mag + np.abs(b64)) if bias is not None else 0) + 1e-30
    assert np.all(np.abs(got - (x64 @ w64 + b64)) <= bound)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("transpose_b", [True, False])
def test_merged_projections_stay_within_the_fp32_bound(with_bias: bool, transpose_b: bool):
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((K, n)).astype(np.float32) for n in WIDTHS]
    biases = [rng.standard_normal(n).astype(np.float32) for n in WIDTHS] if with_bias else []
    pm = PassManager("merge-matmuls,dce")
    merged = pm.run(_projections(weights, biases, transpose_b))
    assert pm.passes[0].stats == {"num-merged": 3}
    assert [op.name for op in merged.walk()].count("matmul") == 1
    compiled = tf.compile(_projections(weights, biases, transpose_b))
    for n in (1, 7, 33):
        x = rng.standard_normal((n, K)).astype(np.float32)
        for outs in (tf.interpret(merged, x), compiled(x)):
            for i, got in enumerate(outs):
                _check(got, x, weights[i], biases[i] if biases else None)


def test_graphs_over_the_same_weights_share_one_merged_weight():
    """Two modules whose constants are the same arrays (a model's prompt and decode graphs on
    its frozen weights) get one merged array; a part changed in place is merged anew."""
    rng = np.random.default_rng(2)
    weights = [rng.standard_normal((w, K)).astype(np.float32) for w in WIDTHS]

    def merged():
        b = Builder("main")
        x = b.arg("x", "f32", (3, K))
        b_outs = [b.op("matmul", x, b.constant(w, copy=False), transpose_b=True)
                  for w in weights]
        module = PassManager("merge-matmuls,dce").run(b.build(*b_outs))
        (mm,) = [op for op in module.walk() if op.name == "matmul"]
        return mm.operands[1].defining_op.attrs["value"]

    first, second = merged(), merged()
    assert first is second and np.array_equal(first, np.concatenate(weights))
    weights[1][2, 3] += 1.0
    third = merged()
    assert third is not first and np.array_equal(third, np.concatenate(weights))


def test_weights_adjacent_in_one_buffer_are_viewed_not_copied():
    """Rows of one buffer, one after another (as the GGUF builder reads a layer's projections),
    merge into a view of that buffer; the same rows in another order, or parts of two buffers,
    are copied. Either way the merged weight holds the parts' values, and the compiled merged
    GEMM stays within the fp32 bound."""
    from tilefold.passes.merge_matmuls import concatenated

    rng = np.random.default_rng(4)
    buffer = rng.standard_normal((sum(WIDTHS), K)).astype(np.float32)
    cuts = np.cumsum(WIDTHS)[:-1]
    parts = np.split(buffer, cuts)
    view = concatenated(parts, 0)
    assert np.shares_memory(view, buffer) and np.array_equal(view, buffer)
    for others in (parts[::-1], [parts[0], parts[1].copy(), parts[2]]):
        copied = concatenated(others, 0)
        assert not np.shares_memory(copied, buffer)
        assert np.array_equal(copied, np.concatenate(others))
    transposed = [p.T for p in parts]  # [K, n] parts joined along axis 1: never a view
    joined = concatenated(transposed, 1)
    assert not np.shares_memory(joined, buffer) and np.array_equal(joined, buffer.T)

    b = Builder("main")
    x = b.arg("x", "f32", ("n", K))
    module = b.build(*[b.op("matmul", x, b.constant(p, copy=False), transpose_b=True)
                       for p in parts])
    compiled = tf.compile(module)
    xs = rng.standard_normal((5, K)).astype(np.float32)
    for got, p in zip(compiled(xs), parts, strict=True):
        _check(got, xs, p.T, None)


def test_adjacent_arrays_of_no_common_buffer_are_copied():
    """Parts that merely sit one after another in memory, each an array of its own (as a
    framework's separately made parameters may: NumPy sees no common base), are copied."""
    import ctypes

    from tilefold.passes.merge_matmuls import concatenated

    rng = np.random.default_rng(6)
    buffer = rng.standard_normal((sum(WIDTHS), K)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(WIDTHS)[:-1]]) * K * 4
    parts = [np.ctypeslib.as_array((ctypes.c_float * (w * K)).from_address(
        buffer.ctypes.data + int(at))).reshape(w, K) for w, at in zip(WIDTHS, offsets,
                                                                       strict=True)]
    merged = concatenated(parts, 0)
    assert np.array_equal(merged, buffer) and not np.shares_memory(merged, buffer)
