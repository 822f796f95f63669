"""matmul, the layout ops (reshape ... squeeze), gather and constant against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ir_oracle import assert_close, round_once, run_op

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir import Builder, interpret
from tilefold.ir.ops.shape import BEGIN, END

RNG = np.random.default_rng(7)


def rand(*shape, dt=np.float64):
    return (RNG.standard_normal(shape) * 2).astype(dt)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_with_transpose_flags(ta, tb) -> None:
    a, b = rand(3, 4), rand(4, 5)
    a_in, b_in = (a.T.copy() if ta else a), (b.T.copy() if tb else b)
    got = run_op("matmul", a_in, b_in, transpose_a=ta, transpose_b=tb)
    assert_close(got, a @ b, scale=100)


@pytest.mark.parametrize(
    ("sa", "sb", "out"),
    [
        ((2, 1, 3, 4), (5, 4, 2), (2, 5, 3, 2)),  # batch dims broadcast
        ((4,), (4, 6), (6,)),  # 1-D a is a row vector
        ((3, 4), (4,), (3,)),  # 1-D b is a column vector
        ((4,), (4,), ()),  # dot product
        ((7, 3, 4), (4,), (7, 3)),
        ((3, 0), (0, 2), (3, 2)),  # empty contraction: zeros
    ],
)
def test_matmul_shapes_follow_numpy(sa, sb, out) -> None:
    a, b = rand(*sa), rand(*sb)
    got = run_op("matmul", a, b)
    assert got.shape == out
    assert_close(got, np.matmul(a, b), scale=100)


def test_matmul_integers_accumulate_wide_and_low_precision_rounds_once() -> None:
    a = np.full((2, 64), 100, np.int8)
    b = np.full((64, 3), 100, np.int8)
    got = run_op("matmul", a, b)
    assert got.dtype == np.int32 and (got == 640000).all()
    x, y = rand(8, 32, dt=np.float32), rand(32, 8, dt=np.float32)
    for dt in (dtypes.bf16, dtypes.f16):
        xs, ys = x.astype(dt.np_dtype), y.astype(dt.np_dtype)
        expected = round_once(xs.astype(np.float64) @ ys.astype(np.float64), dt)
        assert run_op("matmul", xs, ys).tobytes() == expected.tobytes()
    with pytest.raises(ShapeError, match="contraction"):
        run_op("matmul", rand(3, 4), rand(5, 2))
    with pytest.raises(DTypeError):
        run_op("matmul", np.ones((2, 2), bool), np.ones((2, 2), bool))


def test_matmul_takes_unsigned_bytes_by_signed_bytes() -> None:
    """u8 @ i8 (quantized activations by weights) accumulates exactly in i32; i8 @ u8 and
    other mixes still need a cast."""
    rng = np.random.default_rng(8)
    a = rng.integers(0, 256, (3, 40)).astype(np.uint8)
    b = rng.integers(-128, 128, (40, 5)).astype(np.int8)
    got = run_op("matmul", a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    with pytest.raises(DTypeError, match="share one dtype"):
        run_op("matmul", b.T.copy(), a.T.copy())


def test_reshape_transpose_broadcast_expand_squeeze() -> None:
    x = rand(2, 3, 4)
    np.testing.assert_array_equal(run_op("reshape", x, shape=[4, -1]), x.reshape(4, -1))
    np.testing.assert_array_equal(run_op("reshape", x, shape=[24]), x.reshape(24))
    np.testing.assert_array_equal(run_op("transpose", x, perm=[2, 0, 1]), x.transpose(2, 0, 1))
    y = rand(3, 1)
    np.testing.assert_array_equal(
        run_op("broadcast_to", y, shape=[2, 3, 5]), np.broadcast_to(y, (2, 3, 5))
    )
    np.testing.assert_array_equal(run_op("expand_dims", y, axes=[0, -1]), y[None, :, :, None])
    np.testing.assert_array_equal(run_op("squeeze", y, axes=[-1]), y[:, 0])
    with pytest.raises(ShapeError, match="not all 1"):
        run_op("squeeze", x, axes=[0])
    with pytest.raises(ShapeError, match="permutation"):
        run_op("transpose", x, perm=[0, 0, 1])
    with pytest.raises(ShapeError):
        run_op("reshape", x, shape=[5, -1])
    with pytest.raises(ShapeError, match="broadcast"):
        run_op("broadcast_to", rand(3, 2), shape=[3, 4])


def test_reshape_and_broadcast_with_symbolic_dims_bind_at_run_time() -> None:
    b = Builder()
    x = b.arg("x", "f32", ("b", 6))
    y = b.op("reshape", x, shape=["b", 2, -1])
    z = b.op("broadcast_to", b.op("expand_dims", y, axes=[0]), shape=[4, "b", 2, 3])
    module = b.build(y, z)
    assert str(z.type) == "f32[4,?b,2,3]"
    data = rand(5, 6, dt=np.float32)
    got_y, got_z = interpret(module, data)
    np.testing.assert_array_equal(got_y, data.reshape(5, 2, 3))
    np.testing.assert_array_equal(got_z, np.broadcast_to(data.reshape(5, 2, 3), (4, 5, 2, 3)))


bounds = st.one_of(st.integers(-7, 7), st.sampled_from([END, BEGIN]))


@given(
    st.lists(st.tuples(bounds, bounds, st.integers(-3, 3).filter(bool)), min_size=2, max_size=2),
)
def test_slice_matches_python_slicing_including_negative_steps(params) -> None:
    x = np.arange(30.0).reshape(5, 6)
    starts, stops, steps = map(list, zip(*params, strict=True))
    got = run_op("slice", x, starts=starts, stops=stops, steps=steps)
    np.testing.assert_array_equal(got, x[tuple(slice(*p) for p in params)])


def test_slice_keeps_or_reverses_symbolic_dims_only_whole() -> None:
    b = Builder()
    x = b.arg("x", "f32", ("n", 4))
    rev = b.op("slice", x, starts=[-1, 0], stops=[BEGIN, END], steps=[-1, 2])
    module = b.build(rev)
    data = rand(3, 4, dt=np.float32)
    np.testing.assert_array_equal(interpret(module, data)[0], data[::-1, ::2])
    with pytest.raises(ShapeError, match="whole"):
        b2 = Builder()
        b2.op("slice", b2.arg("x", "f32", ("n",)), starts=[1], stops=[END], steps=[1])


def test_concat() -> None:
    xs = [rand(2, k) for k in (1, 3, 2)]
    np.testing.assert_array_equal(run_op("concat", *xs, axis=-1), np.concatenate(xs, axis=-1))
    np.testing.assert_array_equal(run_op("concat", xs[1], axis=1), xs[1])
    with pytest.raises(ShapeError, match="differs"):
        run_op("concat", rand(2, 3), rand(3, 3), axis=1)
    with pytest.raises(DTypeError):
        run_op("concat", rand(2), rand(2, dt=np.float32))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_with_negative_indices_matches_take(axis) -> None:
    x = rand(4, 5, 3)
    idx = np.array([[0, -1], [2, -3], [1, -2]], np.int32)
    np.testing.assert_array_equal(run_op("gather", x, idx, axis=axis), np.take(x, idx, axis=axis))
    np.testing.assert_array_equal(
        run_op("gather", x, np.array([-3, 2], np.int8), axis=axis),
        np.take(x, [-3, 2], axis=axis),
    )


def test_gather_is_an_embedding_lookup_and_checks_its_range() -> None:
    table = rand(10, 4, dt=np.float32)
    ids = np.array([[1, 9, 0], [3, 3, -10]], np.int64)
    np.testing.assert_array_equal(run_op("gather", table, ids), table[ids])
    with pytest.raises(ShapeError, match="out of range"):
        run_op("gather", table, np.array([10], np.int64))
    with pytest.raises(DTypeError, match="integers"):
        run_op("gather", table, np.array([1.0]))


@pytest.mark.parametrize("dt", dtypes.ALL_DTYPES, ids=str)
def test_constant_yields_its_value(dt) -> None:
    value = np.arange(-3, 3).reshape(2, 3).astype(dt.np_dtype)
    b = Builder()
    module = b.build(b.op("constant", value=value))
    got = interpret(module)[0]
    assert got.dtype == value.dtype and got.tobytes() == value.tobytes()


@pytest.mark.parametrize(
    ("op", "shape", "attrs", "message"),
    [
        ("reshape", (2, 3), {"shape": [-1, -1]}, "at most one -1"),
        ("reshape", (2, 3), {"shape": [-2, 3]}, "negative size"),
        ("reshape", ("?(b+1)", 4), {"shape": [-1, 2]}, "cannot infer -1"),
        ("reshape", ("b", 3), {"shape": [-1, 2]}, "do not divide"),
        ("reshape", ("b", "t"), {"shape": ["?(b*b)"]}, "element counts differ"),
        ("reshape", ("b", 3), {"shape": ["n", 3]}, "element counts differ"),
        ("reshape", ("b", 3), {"shape": [-1, "n"]}, "cannot reshape"),
        ("slice", (2, 3), {"starts": [0], "stops": [1], "steps": [1]}, "need 2 entries each"),
        ("slice", (2,), {"starts": [0], "stops": [1], "steps": [0]}, "step cannot be 0"),
        ("expand_dims", (2,), {"axes": [0, 0]}, "repeated axis"),
        ("gather", (2,), {"axis": 1}, "out of range for rank 1"),
    ],
)
def test_layout_ops_reject_impossible_shapes(op, shape, attrs, message) -> None:
    b = Builder()
    operands = [b.arg("x", "f32", shape)] + ([b.arg("i", "i32", (2,))] if op == "gather" else [])
    with pytest.raises(ShapeError, match=message):
        b.op(op, *operands, **attrs)
    with pytest.raises(ShapeError, match="needs at least one operand"):
        b.op("concat")


def test_integer_index_of_a_symbolic_dim_needs_gather() -> None:
    b = Builder()
    with pytest.raises(ShapeError, match="use gather"):
        b.arg("x", "f32", ("n", 2))[0]
