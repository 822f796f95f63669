"""The Python builder and functional API: operators, scalar promotion, indexing, trace()."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tilefold import dtypes
from tilefold.errors import Location
from tilefold.ir import Builder, interpret, parse_module, print_module, trace, verify
from tilefold.ir import functional as F

RNG = np.random.default_rng(11)


def rand(*shape, dt=np.float32):
    return (RNG.standard_normal(shape) * 2).astype(dt)


def test_operators_read_like_numpy() -> None:
    def model(x, w, b):
        h = x @ w + b
        return (-h * 2.0 - 1.0) / (abs(h) + 3.0) ** 2, h.T, h[0], 1.0 - h, h > 0.5

    module = trace(model, ("x", "f32", (4, 8)), ("w", "f32", (8, 3)), ("b", "f32", (3,)))
    x, w, b = rand(4, 8), rand(8, 3), rand(3)
    h = (x.astype(np.float64) @ w + b).astype(np.float32)
    got = interpret(module, x, w, b)
    np.testing.assert_allclose(got[0], (-h * 2 - 1) / (np.abs(h) + 3) ** 2, rtol=1e-5)
    np.testing.assert_allclose(got[1], h.T, rtol=1e-6)
    np.testing.assert_allclose(got[2], h[0], rtol=1e-6)
    np.testing.assert_allclose(got[3], 1 - h, rtol=1e-6)
    np.testing.assert_array_equal(got[4], h > 0.5)


@pytest.mark.parametrize(
    ("dtype", "scalar", "result"),
    [
        ("bf16", 2.0, "bf16"),  # a Python float adapts to a float tensor
        ("f16", 3, "f16"),
        ("i32", 2.5, "f32"),  # ... but a float next to ints makes the result float
        ("i8", 3, "i8"),
        ("u8", True, "u8"),
        ("bool", 1, "i64"),  # an int next to bools makes the result an integer
    ],
)
def test_python_scalars_are_weakly_typed(dtype, scalar, result) -> None:
    b = Builder()
    x = b.arg("x", dtype, (3,))
    assert (x * scalar).dtype == dtypes.dtype(result)
    assert (scalar * x).dtype == dtypes.dtype(result)
    assert F.maximum(x, scalar).dtype == dtypes.dtype(result) or dtype == "bool"


def test_tensors_and_numpy_data_promote_strongly() -> None:
    b = Builder()
    x = b.arg("x", "f32", (3,))
    h = b.arg("h", "bf16", (3,))
    assert (x + h).dtype == dtypes.f32
    assert (b.arg("i", "i8", (3,)) + b.arg("u", "u8", (3,))).dtype == dtypes.i32
    assert (h + np.ones(3, np.float64)).dtype == dtypes.f64  # NumPy data keeps its dtype
    assert (np.ones(3, np.float32) + h).dtype == dtypes.f32  # ndarray + Tensor -> __radd__
    assert (h + np.float16(1)).dtype == dtypes.f32  # NumPy scalars are strong: bf16+f16 -> f32
    assert b.constant(1.5).dtype == dtypes.f32 and b.constant([1, 2]).dtype == dtypes.i64
    assert b.constant(0.1, "bf16").value.defining_op.attrs["value"].tobytes() == (
        np.array(0.1).astype(np.float32).astype(dtypes.bf16.np_dtype).tobytes()
    )


def test_iterating_unpacks_the_first_axis() -> None:
    b = Builder()
    first, second = b.arg("x", "f32", (2, 3))
    module = b.build(second, first)
    data = rand(2, 3)
    got = interpret(module, data)
    np.testing.assert_array_equal(got[0], data[1])
    np.testing.assert_array_equal(got[1], data[0])


def test_bool_operators() -> None:
    module = trace(lambda a, c: (a & c) | (a > c), ("a", "bool", (4,)), ("c", "bool", (4,)))
    a = np.array([True, True, False, False])
    c = np.array([True, False, True, False])
    np.testing.assert_array_equal(interpret(module, a, c)[0], (a & c) | (a > c))


indices = st.one_of(
    st.integers(-3, 2),
    st.none(),
    st.just(Ellipsis),
    st.builds(
        slice,
        st.none() | st.integers(-5, 5),
        st.none() | st.integers(-5, 5),
        st.none() | st.integers(-3, 3).filter(bool),
    ),
)


@given(st.lists(indices, max_size=4))
def test_indexing_matches_numpy(items) -> None:
    if items.count(Ellipsis) > 1 or sum(i is not None and i is not Ellipsis for i in items) > 3:
        return
    data = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    b = Builder()
    x = b.arg("x", "f32", data.shape)
    module = b.build(x[tuple(items)])
    np.testing.assert_array_equal(interpret(module, data)[0], data[tuple(items)])


def test_indexing_keeps_symbolic_dims() -> None:
    b = Builder()
    x = b.arg("x", "f32", ("batch", 6))
    y = x[:, 1:5:2]
    z = x[::-1, None, -1]
    assert str(y.type) == "f32[?batch,2]" and str(z.type) == "f32[?batch,1]"
    module = b.build(y, z)
    data = rand(3, 6)
    got = interpret(module, data)
    np.testing.assert_array_equal(got[0], data[:, 1:5:2])
    np.testing.assert_array_equal(got[1], data[::-1, None, -1])


def test_functional_api() -> None:
    def model(x, table, ids):
        e = F.embedding(table, ids)
        n = F.layer_norm(e, np.ones(4, np.float32), np.zeros(4, np.float32), eps=1e-6)
        r = F.rms_norm(n, np.full(4, 2.0, np.float32))
        s = F.softmax(F.matmul(x, r, transpose_b=True), axis=-1)
        c = F.concat([F.sum(s, axis=1), F.max(s, axis=(0, 1), keepdims=True)[0]])
        w = F.where(s > 0.3, s, 0.0)
        return c, F.transpose(w), F.squeeze(F.reshape(w, (1, 2, 3)), 0), F.cast(F.gelu(x), "bf16")

    module = trace(model, ("x", "f32", (2, 4)), ("table", "f32", (10, 4)), ("ids", "i32", (3,)))
    text = print_module(module)
    assert print_module(verify(parse_module(text))) == text
    x, table, ids = rand(2, 4), rand(10, 4), np.array([1, 7, 7], np.int32)
    c, wt, w3, g = interpret(module, x, table, ids)
    e = table[ids].astype(np.float64)
    n = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-6)
    r = n / np.sqrt((n**2).mean(-1, keepdims=True) + 1e-6) * 2
    logits = x.astype(np.float64) @ r.T
    s = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(c, [s.sum(1)[0], s.sum(1)[1], s.max()], rtol=1e-5)
    np.testing.assert_allclose(wt, np.where(s > 0.3, s, 0).T, rtol=1e-5)
    assert w3.shape == (2, 3) and g.dtype == dtypes.bf16.np_dtype


def test_where_with_two_scalars_and_mixed_types() -> None:
    b = Builder()
    x = b.arg("x", "f16", (3,))
    assert F.where(x > 0, 1.0, 0).dtype == dtypes.f32
    assert F.where(x > 0, x, 0).dtype == dtypes.f16


def test_trace_with_symbolic_dims_and_several_outputs() -> None:
    module = trace(lambda x: (F.relu(x), F.mean(x, axis=-1)), ("x", "f32", ("batch", "seq_len", 8)))
    fn = module["main"]
    assert [str(t) for t in fn.result_types] == ["f32[?batch,?seq_len,8]", "f32[?batch,?seq_len]"]
    data = rand(2, 5, 8)
    relu, mean = interpret(module, data)
    np.testing.assert_array_equal(relu, np.maximum(data, 0))
    np.testing.assert_allclose(mean, data.astype(np.float64).mean(-1), rtol=1e-6)


def test_locations_and_strides_print_and_parse_back() -> None:
    b = Builder("main")
    x = b.arg("x", "f32", (4, 8), strides=(1, 4))
    b.loc = Location('model "v2".py', 3, 8)
    y = F.exp(x)
    b.loc = None
    b.function.loc = Location("model.py", 1, 1)
    module = b.build(y)
    text = print_module(module)
    assert 'exp(%x) : f32[4,8] loc("model \\"v2\\".py":3:8)' in text
    assert 'func @main(%x: f32[4,8]{1,4}) -> (f32[4,8]) loc("model.py":1:1) {' in text
    parsed = parse_module(text)
    assert parsed["main"].ops[0].loc == Location('model "v2".py', 3, 8)
    assert parsed["main"].args[0].type.strides == (1, 4)


def test_builders_share_a_module_and_name_results_in_order() -> None:
    first = Builder("first")
    first.build(first.arg("a", "f32", ()) + 1.0)
    second = Builder("second", first.module)
    z = second.arg("0", "i32", (2,))
    y = z * 2
    assert y.value.name == "2"  # %0 is the argument; the constant is %1
    module = second.build(y)
    assert list(module.functions) == ["first", "second"]
    assert interpret(module, np.array([1, 2], np.int32), function="second")[0].tolist() == [2, 4]
