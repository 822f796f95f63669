"""A compiled graph called twice with the same input arrays records its steps and replays them in
one native call from then on (`compiler.Recording`): the answers follow the inputs' contents,
written in place between calls, exactly as the step-by-step path gives them; new input arrays
go back to that path; native row writes and gathers check their indices; and the methods that
keep index arithmetic and data movement native (scalar loops, copies) agree with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.codegen.llvm.cpu.scalar import Node, ScalarGroup, split_sizes
from tilefold.compiler import Recording
from tilefold.compiler import compile as tf_compile
from tilefold.errors import ShapeError
from tilefold.ir import Builder, interpret, parse_module
from tilefold.ir import functional as F
from tilefold.runtime.replay import Replay

RNG = np.random.default_rng(5)

# A decode step's skeleton: an embedding gather, a position computed from a length (i64), the
# cache row written in place, attention over the cache, a projection and a concat.
STEP = """func @main(%ids: i64[1], %length: i64[], %cache: f32[1,2,16,8], %table: f32[50,16],
                  %w: f32[16,16], %mask: bool[1,1,1,16]) -> (f32[1,16], f32[1,2,16,8], i64[]) {
  %one = constant() {value = dense<i64[] [1]>} : i64[]
  %zero = constant() {value = dense<i64[1] [0]>} : i64[1]
  %x = gather(%table, %ids) : f32[1,16]
  %pos = add(%zero, %length) : i64[1]
  %next = add(%length, %one) : i64[]
  %h = matmul(%x, %w) : f32[1,16]
  %kv = reshape(%h) {shape = [1, 2, 1, 8]} : f32[1,2,1,8]
  %c = index_put(%cache, %kv, %pos) {axes = [2]} : f32[1,2,16,8]
  %q = reshape(%h) {shape = [1, 2, 1, 8]} : f32[1,2,1,8]
  %a = scaled_dot_product_attention(%q, %c, %c, %mask) : f32[1,2,1,8]
  %t = reshape(%a) {shape = [1, 16]} : f32[1,16]
  %left = slice(%t) {starts = [0, 8], stops = [1, 16], steps = [1, 1]} : f32[1,8]
  %right = slice(%t) {starts = [0, 0], stops = [1, 8], steps = [1, 1]} : f32[1,8]
  %r = concat(%left, %right) {axis = 1} : f32[1,16]
  %y = add(%r, %x) : f32[1,16]
  return(%y, %c, %next)
}"""


def _step_inputs():
    return [np.array([7], np.int64), np.array(3, np.int64),
            RNG.standard_normal((1, 2, 16, 8)).astype(np.float32),
            RNG.standard_normal((50, 16)).astype(np.float32),
            (RNG.standard_normal((16, 16)) / 4).astype(np.float32),
            np.zeros((1, 1, 1, 16), bool)]


def _decode(run, module, steps: int):
    """Decode `steps` tokens with the inputs updated in place, as a generation loop does;
    compare every step with the interpreter on copies."""
    ids, length, cache, table, w, mask = _step_inputs()
    ref_cache = cache.copy()
    for step in range(steps):
        mask[..., : int(length) + 1] = True
        want_y, want_cache, want_next = interpret(module, ids.copy(), length.copy(), ref_cache,
                                                  table, w, mask.copy())
        y, new_cache, nxt = run(ids, length, cache, table, w, mask)
        assert new_cache is cache  # donated: written in place
        np.testing.assert_allclose(y, want_y, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(cache, want_cache, rtol=2e-5, atol=2e-5)
        assert int(nxt) == int(want_next) == int(length) + 1
        ref_cache = want_cache
        length[...] = nxt
        ids[0] = (ids[0] * 7 + step) % 50
    return run


def test_a_decode_step_replays_natively_and_follows_its_inputs():
    module = parse_module(STEP)
    run = tf_compile(module, strict=True, donate={1: 2})
    _decode(run, module, 6)
    (plan,) = run._plans.values()
    assert isinstance(plan.replay, Recording)
    assert plan.replay.native_steps == len(plan.steps)
    assert len(plan.replay.segments) == 1 and isinstance(plan.replay.segments[0], Replay)


def test_the_step_by_step_path_gives_the_same_answers(monkeypatch):
    monkeypatch.setenv("TILEFOLD_REPLAY", "0")
    module = parse_module(STEP)
    run = tf_compile(module, strict=True, donate={1: 2})
    _decode(run, module, 3)
    assert all(plan.replay is None for plan in run._plans.values())


def test_new_input_arrays_run_step_by_step_and_record_again():
    b = Builder("main")
    x = b.arg("x", "f32", (4, 8))
    w = b.constant(RNG.standard_normal((8, 8)).astype(np.float32))
    module = b.build(F.gelu(x @ w))
    run = tf_compile(module, strict=True)
    a = RNG.standard_normal((4, 8)).astype(np.float32)
    first = run(a)[0]
    assert run(a)[0] is not run(a)[0]  # results are the caller's: fresh arrays each call
    (plan,) = run._plans.values()
    recording = plan.replay
    assert recording is not None
    other = RNG.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(run(other)[0], interpret(module, other)[0], rtol=1e-5,
                               atol=1e-5)
    assert plan.replay is recording  # one call with new arrays: the old recording stays
    np.testing.assert_array_equal(run(a)[0], first)


def test_an_index_out_of_range_in_a_replayed_gather_is_an_error():
    b = Builder("main")
    table = b.arg("table", "f32", (10, 4))
    ids = b.arg("ids", "i64", (2,))
    run = tf_compile(b.build(F.relu(b.op("gather", table, ids))), strict=True)
    t = RNG.standard_normal((10, 4)).astype(np.float32)
    i = np.array([1, 9], np.int64)
    for _ in range(3):
        np.testing.assert_array_equal(run(t, i)[0], np.maximum(t[i], 0))
    i[1] = 10
    with pytest.raises(ShapeError, match="out of range"):
        run(t, i)
    i[1] = -10  # counts from the end
    np.testing.assert_array_equal(run(t, i)[0], np.maximum(t[[1, 0]], 0))


INT_OPS = ["add", "sub", "mul", "max", "min", "lt", "le", "gt", "ge", "eq", "ne"]


@pytest.mark.parametrize("dtype", ["i64", "i32", "i8"])
@pytest.mark.parametrize("op", INT_OPS)
def test_scalar_loops_compute_integers_as_numpy(op, dtype):
    b = Builder("main")
    x = b.arg("x", dtype, (3, 5))
    y = b.arg("y", dtype, (5,))
    module = b.build(b.op(op, x, y))
    run = tf_compile(module, strict=True)
    info = np.iinfo(np.dtype(dtype.replace("i", "int")))
    xa = RNG.integers(info.min, info.max, (3, 5), endpoint=True).astype(info.dtype)
    ya = RNG.integers(info.min, info.max, (5,), endpoint=True).astype(info.dtype)
    (got,) = run(xa, ya)
    np.testing.assert_array_equal(got, interpret(module, xa, ya)[0])
    assert [d.winner.method for d in run.decisions((3, 5), (5,))] == ["handwritten.scalar"]


def test_scalar_casts_and_selects():
    b = Builder("main")
    n = b.arg("n", "i64", ())
    flags = b.arg("flags", "bool", (4,))
    pos = b.op("add", b.op("cast", flags, dtype="i64"), n)
    as_float = b.op("cast", pos, dtype="f32")
    small = b.op("cast", pos, dtype="i8")
    picked = b.op("where", flags, pos, b.op("neg", pos))
    module = b.build(as_float, small, picked, b.op("and", flags, b.op("ne", pos, n)))
    run = tf_compile(module, strict=True)
    for value in (3, 2**40 + 1, -(2**62), 127):
        args = [np.array(value, np.int64), np.array([True, False, True, True])]
        for got, want in zip(run(*args), interpret(module, *args), strict=True):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype


@pytest.mark.parametrize(("dtype", "start", "step"),
                         [("i64", 0.0, 1.0), ("i32", -3.0, 2.0), ("f32", 0.5, 0.25),
                          ("f64", 1.0, -1.5)])
def test_a_lone_arange_of_a_symbolic_length_is_a_native_scalar_loop(dtype, start, step):
    """`arange(?n)`, as a decode step's positions start, at lengths 0, 1, a prime and 64."""
    b = Builder("main")
    x = b.arg("x", "f32", ("?n",))
    module = b.build(b.op("arange", shape=(x.type.shape[0],), start=start, step=step,
                          dtype=dtype))
    run = tf_compile(module, strict=True)
    for n in (0, 1, 7, 64):
        (got,) = run(np.zeros(n, np.float32))
        want = interpret(module, np.zeros(n, np.float32))[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        assert [d.winner.method for d in run.decisions((n,))] == ["handwritten.scalar"]


def test_dim_size_is_a_native_constant_of_the_plan():
    """`dim_size(x) - 1` (a last token's index): native at every length, 0 included (x is
    never read)."""
    b = Builder("main")
    x = b.arg("x", "i64", (1, "?n"))
    module = b.build(b.op("dim_size", x, axis=1) - b.constant(np.int64(1)))
    run = tf_compile(module, strict=True)
    for n in (0, 1, 13):
        (got,) = run(np.zeros((1, n), np.int64))
        np.testing.assert_array_equal(got, interpret(module, np.zeros((1, n), np.int64))[0])
        assert got == n - 1
        assert {d.winner.method for d in run.decisions((1, n))} == {"handwritten.scalar"}


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_native_concat_and_gather_match_numpy(axis):
    b = Builder("main")
    x = b.arg("x", "f32", (3, 4, 5))
    y = b.arg("y", "f32", (3, 4, 5))
    ids = b.arg("ids", "i64", (2, 3))
    joined = b.op("concat", x, y, axis=axis)
    picked = b.op("gather", joined, ids, axis=axis)
    module = b.build(F.exp(picked))
    run = tf_compile(module, strict=True)
    xa, ya = (RNG.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(2))
    size = np.concatenate([xa, ya], axis=axis).shape[axis]
    ia = RNG.integers(-size, size, (2, 3)).astype(np.int64)
    for _ in range(3):
        np.testing.assert_allclose(run(xa, ya, ia)[0], interpret(module, xa, ya, ia)[0],
                                   rtol=1e-6)
    methods = {d.winner.method for d in run.decisions((3, 4, 5), (3, 4, 5), (2, 3))}
    assert "handwritten.movement" in methods
    (plan,) = run._plans.values()
    assert plan.replay.native_steps == len(plan.steps)


def test_native_index_by_constants_matches_numpy():
    """transformers' padding mask, `mask[arange(b)[:, None, None, None], arange(s)]`, with a
    negative index and a float table beside it: a native copy by precomputed positions."""
    b = Builder("main")
    mask = b.arg("mask", "bool", (3, 5))
    table = b.arg("table", "f32", (2, 4, 6, 3))
    rows = b.constant(np.array([0, 2, -1], np.int64).reshape(3, 1, 1, 1))
    cols = b.constant(np.arange(5, dtype=np.int64).reshape(1, 1, 1, 5)[..., ::-1].copy())
    picked = b.op("index", mask, rows, cols, axes=[0, 1])
    inner = b.op("index", table, b.constant(np.array([[3, -4], [1, 0]], np.int64)),
                 b.constant(np.array([5, -1], np.int64)), axes=[1, 2])
    module = b.build(picked, F.exp(inner))
    run = tf_compile(module, strict=True)
    ma = RNG.random((3, 5)) < 0.5
    ta = RNG.standard_normal((2, 4, 6, 3)).astype(np.float32)
    for _ in range(3):
        ma[...] = RNG.random((3, 5)) < 0.5  # in place: the replayed copy follows
        got, want = run(ma, ta), interpret(module, ma, ta)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    methods = [d.winner.method for d in run.decisions((3, 5), (2, 4, 6, 3))]
    assert methods.count("handwritten.movement") == 2
    (plan,) = run._plans.values()
    assert plan.replay.native_steps == len(plan.steps)


def test_an_index_by_constants_out_of_range_is_still_an_error():
    b = Builder("main")
    x = b.arg("x", "f32", (3, 4))
    module = b.build(b.op("index", x, b.constant(np.array([0, 3], np.int64)), axes=[0]))
    with pytest.raises(ShapeError, match="index out of range"):
        tf_compile(module, strict=True)(np.zeros((3, 4), np.float32))


def test_native_index_by_run_time_tensors_matches_numpy():
    """An index whose index tensors are computed at run time (a symbolic length's `arange`):
    a scalar loop of merged positions, then a native gather; negative indices count from the
    end and an index out of its axis' range is an error, even when its merged position would
    fall inside the tensor."""
    b = Builder("main")
    table = b.arg("table", "f32", (4, 6, 3))
    rows, cols = b.arg("rows", "i64", (2, 1)), b.arg("cols", "i64", (5,))
    module = b.build(F.relu(b.op("index", table, rows, cols, axes=[0, 1])))
    run = tf_compile(module, strict=True)
    ta = RNG.standard_normal((4, 6, 3)).astype(np.float32)
    ra, ca = np.array([[3], [-4]], np.int64), np.array([5, -1, 0, 2, -6], np.int64)
    for _ in range(3):
        (got,), (want,) = run(ta, ra, ca), interpret(module, ta, ra, ca)
        np.testing.assert_array_equal(got, want)
        ca[...] = RNG.integers(-6, 6, 5)  # in place: the replayed positions follow
    (plan,) = run._plans.values()
    assert plan.replay.native_steps == len(plan.steps)
    assert [d.winner.method for d in run.decisions((4, 6, 3), (2, 1), (5,))].count(
        "handwritten.movement") == 1
    for bad in (6, -7):  # row 0, column 6: inside the table merged, outside its axis
        ca[0] = bad
        with pytest.raises(ShapeError, match="out of range"):
            run(ta, ra, ca)


def test_a_symbolic_mask_index_runs_one_loop_for_every_length():
    """transformers' padding mask over a symbolic length, `mask[arange(2)[:, None, None,
    None], arange(s)]`: native at every length, by one compiled scalar loop."""
    module = parse_module("""func @main(%mask: bool[2,?s]) -> (bool[2,1,1,?s]) {
  %b = arange() {shape = [2]} : i64[2]
  %s = arange() {shape = [?s]} : i64[?s]
  %rows = reshape(%b) {shape = [2, 1, 1, 1]} : i64[2,1,1,1]
  %cols = reshape(%s) {shape = [1, 1, 1, ?s]} : i64[1,1,1,?s]
  %m = index(%mask, %rows, %cols) {axes = [0, 1]} : bool[2,1,1,?s]
  return(%m)
}""")
    run = tf_compile(module, strict=True)
    for n in (1, 7, 3, 16):
        m = RNG.random((2, n)) < 0.5
        for _ in range(2):
            (got,) = run(m)
            np.testing.assert_array_equal(got, m[:, None, None, :])
    assert len(run._plans) == 4
    assert all(p.replay.native_steps == len(p.steps) for p in run._plans.values())
    codes = {split_sizes(ScalarGroup((2, n), (("i64", (n, 1)),), (Node("add", (0, 0), "i64"),),
                                     (1,)))[0] for n in (1, 5, 9)}
    assert len(codes) == 1  # the loop's code is the same at every length: its sizes differ
