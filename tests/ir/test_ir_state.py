"""What generation's state needs from the IR: derived dims (`?(s0+1)`, a KV cache one token
longer), `dim_size`, `index_put` (a static cache's row write) and donated results written in
place by the compiled graph, each against NumPy and the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from ir_oracle import run_op

import tilefold
from tests.tolerances import assert_close
from tilefold import dtypes
from tilefold.errors import DTypeError, ParseError, ShapeError
from tilefold.ir import Builder, interpret, parse_module, print_module, verify
from tilefold.ir.dims import Bindings, free_symbols, is_derived, least, parse, render
from tilefold.ir.types import SymDim, TensorType, bind_dim, dim, dim_sum

RNG = np.random.default_rng(11)


def rand(*shape, dt=np.float32):
    return RNG.standard_normal(shape).astype(dt)


# --- derived dims ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("s0+1", "s0+1"), ("1+s0", "s0+1"), ("s1+2*s0-3", "2*s0+s1-3"), ("-s0+s1", "-s0+s1"),
     ("s0+s0", "2*s0"), ("3*b-1", "3*b-1"), ("s1*s0", "s0*s1"), ("s1+2*s1*s0", "2*s0*s1+s1"),
     ("s0*s1+s1*s0", "2*s0*s1"), ("s1*s0*s0-1", "s0*s0*s1-1"), ("b*t+a", "a+b*t")],
)
def test_polynomials_have_one_canonical_text(text, canonical) -> None:
    assert render(*parse(text)) == canonical
    assert is_derived(canonical)


@pytest.mark.parametrize("text", ["s0", "s0+", "s0 + 1", "s1*s0", "s0*2", "s0**2", "s0*", "(s0)",
                                  "", "1", "s0+-1", "s0*s1-s0*s1"])
def test_plain_symbols_and_non_sums_are_not_derived(text) -> None:
    assert not is_derived(text)


def test_bindings_evaluate_sums_from_their_symbols() -> None:
    b = Bindings(s0=7, s1=2)
    assert b["s0+1"] == 8 and b["2*s0-s1+3"] == 15
    assert "s0+1" in b and "s2+1" not in b and b.get("s2+1", -1) == -1
    assert b.bind("s0", 9) == 7  # already bound: the bound size wins
    assert b.bind("s3", 4) == 4 and b["s3-4"] == 0
    with pytest.raises(KeyError):
        b["s2"]
    with pytest.raises(ShapeError, match="cannot be negative"):
        b["s1-5"]
    assert free_symbols("2*s0-s1+3") == {"s0", "s1"} and free_symbols("s0") == {"s0"}


@pytest.mark.parametrize("text", ["s0*s1", "2*s0*s1+s1", "-s0+s0*s0*s1+3", "a+b*t", "-s0*s1+40"])
def test_bindings_evaluate_polynomials_as_integers_do(text) -> None:
    assert is_derived(text)
    rng = np.random.default_rng(5)
    for _ in range(20):
        sizes = {s: int(rng.integers(0, 9)) for s in ("s0", "s1", "a", "b", "t")}
        want = eval(text, {}, dict(sizes))  # the test's own text, as Python
        b = Bindings(sizes)
        if want < 0:
            with pytest.raises(ShapeError, match="cannot be negative"):
                b[text]
        else:
            assert b[text] == want
    assert free_symbols("-s0+s0*s0*s1+3") == {"s0", "s1"}
    assert "s0*s1" not in Bindings(s0=3)  # s1 unbound


@pytest.mark.parametrize("text,smallest,want", [
    ("s0", 2, 2), ("s0*s1", 2, 4), ("2*s0*s1+s1", 2, 10), ("s0*s0*s1+3", 1, 4),
    ("s0+1", 0, 1), ("s0-1", 2, 0), ("-s0*s1+40", 2, 0), ("s0*s1", 1, 1)])
def test_least_is_the_smallest_size_where_it_is_known(text, smallest, want) -> None:
    """`least` is the polynomial's size with every symbol at `smallest` where no coefficient
    is negative (then no larger sizes give less: checked on a grid), else 0."""
    assert least(text, smallest) == want
    if want:
        free = sorted(free_symbols(text))
        grid = np.random.default_rng(3).integers(smallest, smallest + 6, (30, len(free)))
        assert min(Bindings(dict(zip(free, map(int, row), strict=True)))[text]
                   for row in grid) >= want


def test_products_are_dims_and_sum_with_others() -> None:
    s, t = SymDim("s"), SymDim("t")
    st_ = SymDim("s*t")
    assert str(st_) == "?(s*t)" and dim("?(s*t)") == st_
    assert dim_sum(st_, st_, t) == SymDim("2*s*t+t")
    assert dim_sum(SymDim("s*t+1"), -1) == st_ and dim_sum(st_, SymDim("s-s*t")) == s
    with pytest.raises(ShapeError, match="canonical form"):
        SymDim("t*s")


def test_dim_specs_and_sums() -> None:
    assert dim("?(s0+1)") == SymDim("s0+1") and str(SymDim("s0+1")) == "?(s0+1)"
    assert str(dim("?s0")) == "?s0" and dim(5) == 5
    s, t = SymDim("s"), SymDim("t")
    assert dim_sum(s, 1) == SymDim("s+1")
    assert dim_sum(SymDim("s+1"), -1) == s  # back to the plain symbol
    assert dim_sum(s, t, s) == SymDim("2*s+t")
    assert dim_sum(s, SymDim("-s+3")) == 3 and dim_sum(2, 3) == 5
    with pytest.raises(ShapeError, match="canonical form"):
        SymDim("1+s")
    with pytest.raises(ShapeError, match="canonical form"):
        SymDim("s + 1")


def _cache_append() -> str:
    """A growing KV cache: the past (?s0 rows) joined with one new row."""
    b = Builder("main")
    past, new = b.arg("past", "f32", ("s0", 4)), b.arg("new", "f32", (1, 4))
    out = b.op("concat", past, new, axis=0)
    assert out.shape == (SymDim("s0+1"), 4)
    return print_module(b.build(out))


def test_a_derived_dim_round_trips_through_text() -> None:
    text = _cache_append()
    assert "f32[?(s0+1),4]" in text
    assert print_module(verify(parse_module(text))) == text
    with pytest.raises(ParseError, match="canonical form"):
        parse_module(text.replace("?(s0+1)", "?(1+s0)"))


def _flatten_and_back() -> str:
    """[?b,?t,4] flattened to rows (`?(b*t)`, inferred from -1), a softmax over every element of
    the batch, and the rows split back."""
    b = Builder("main")
    x = b.arg("x", "f32", ("b", "t", 4))
    rows = b.op("reshape", x, shape=[-1, 4])
    assert rows.shape == (SymDim("b*t"), 4)
    flat = b.op("softmax", b.op("reshape", rows, shape=["?(4*b*t)"]), axis=0)
    return print_module(b.build(rows, b.op("reshape", flat, shape=["b", "t", 4])))


def test_binding_some_symbols_of_a_polynomial_keeps_the_rest() -> None:
    d = SymDim("b+2*b*t+t-1")
    assert bind_dim(d, {"b": 3}) == SymDim("7*t+2")
    assert bind_dim(d, {"t": 1}) == SymDim("3*b")
    assert bind_dim(d, {"b": 0}) == SymDim("t-1")
    assert bind_dim(d, {"b": 2, "t": 5}) == 26 and bind_dim(SymDim("b*t"), {"b": 0}) == 0
    assert bind_dim(SymDim("b*t"), {"c": 4}) == SymDim("b*t") and bind_dim(6, {}) == 6
    t = TensorType.of("f32", ["?(b*t)", "b", 4]).bind({"b": 5})
    assert str(t) == "f32[?(5*t),5,4]"


def test_a_reshape_of_no_elements_needs_no_symbols_to_agree() -> None:
    b = Builder("main")
    x = b.arg("x", "f32", (0, "n", 4))
    assert b.op("reshape", x, shape=[0, 4]).shape == (0, 4)
    with pytest.raises(ShapeError, match="element counts differ"):
        b.op("reshape", x, shape=[1, 4])


def test_a_product_dim_round_trips_through_text() -> None:
    text = _flatten_and_back()
    assert "f32[?(b*t),4]" in text and "f32[?(4*b*t)]" in text and "f32[?b,?t,4]" in text
    assert print_module(verify(parse_module(text))) == text
    with pytest.raises(ParseError, match="canonical form"):
        parse_module(text.replace("?(b*t)", "?(t*b)"))


@pytest.mark.parametrize(("batch", "length"), [(0, 3), (1, 1), (2, 5), (7, 129)])
def test_flattening_symbolic_dims_matches_numpy(batch, length) -> None:
    module = parse_module(_flatten_and_back())
    x = rand(batch, length, 4)
    flat = x.reshape(-1).astype(np.float64)
    expected = np.exp(flat - flat.max(initial=0.0))
    expected = (expected / expected.sum()).reshape(x.shape) if x.size else expected
    for got in (interpret(module, x), tilefold.compile(module, strict=True)(x)):
        assert got[0].shape == (batch * length, 4)
        np.testing.assert_array_equal(got[0], x.reshape(-1, 4))
        assert got[1].shape == x.shape
        n = max(1, x.size)  # probabilities ~1/n: compared in units of 1/n
        assert_close(got[1] * n, expected.reshape(x.shape) * n, dtype="f32", reduced=n)


@pytest.mark.parametrize("past", [0, 1, 7, 300])
def test_concat_along_symbolic_dims_matches_numpy(past) -> None:
    module = parse_module(_cache_append())
    x, y = rand(past, 4), rand(1, 4)
    expected = np.concatenate([x, y])
    (got,) = interpret(module, x, y)
    assert got.tobytes() == expected.tobytes()
    (compiled,) = tilefold.compile(module, strict=True)(x, y)
    assert compiled.tobytes() == expected.tobytes()


@pytest.mark.parametrize(("a", "c"), [(0, 0), (1, 5), (37, 1), (129, 300)])
def test_concat_of_two_symbols_is_their_sum(a, c) -> None:
    b = Builder("main")
    x, y = b.arg("x", "f32", (2, "a", 3)), b.arg("y", "f32", (2, "c", 3))
    out = b.op("concat", x, y, axis=1)
    assert out.shape == (2, SymDim("a+c"), 3)
    module = b.build(out)
    xs, ys = rand(2, a, 3), rand(2, c, 3)
    (got,) = tilefold.compile(module, strict=True)(xs, ys)
    assert got.tobytes() == np.concatenate([xs, ys], axis=1).tobytes()


def test_a_derived_argument_dim_is_checked_against_its_symbols() -> None:
    b = Builder("main")
    x, y = b.arg("x", "f32", ("s",)), b.arg("y", "f32", ("?(s+1)",))
    module = b.build(b.op("concat", x, b.constant(np.ones(1, np.float32)), axis=0) + y)
    xs, ys = rand(5), rand(6)
    (got,) = interpret(module, xs, ys)
    np.testing.assert_array_equal(got, (np.append(xs, 1.0) + ys).astype(np.float32))
    with pytest.raises(ShapeError, match=r"s\+1"):
        interpret(module, xs, rand(5))


@pytest.mark.parametrize("first", ["rows", "x"])
def test_a_product_argument_dim_is_checked_against_its_symbols_in_any_order(first) -> None:
    """`?(b*t)` bound by its own argument before `?b` and `?t` are (or after): a mismatch is a
    ShapeError naming the sizes, never a wrong size."""
    b = Builder("main")
    args = {"rows": ("rows", "f32", ("?(b*t)", 4)), "x": ("x", "f32", ("b", "t", 4))}
    made = {k: b.arg(*args[k]) for k in (first, "x" if first == "rows" else "rows")}
    module = b.build(b.op("reshape", made["x"], shape=["?(b*t)", 4]) + made["rows"])
    inputs = {"rows": rand(6, 4), "x": rand(2, 3, 4)}
    order = [a.name for a in module.functions["main"].args]
    (got,) = interpret(module, *(inputs[k] for k in order))
    np.testing.assert_array_equal(got, inputs["x"].reshape(6, 4) + inputs["rows"])
    inputs["rows"] = rand(5, 4)
    with pytest.raises(ShapeError, match=r"b\*t"):
        interpret(module, *(inputs[k] for k in order))
    with pytest.raises(ShapeError, match=r"b\*t"):
        tilefold.compile(module, strict=True)(*(inputs[k] for k in order))


def test_dim_size_reads_a_symbolic_size_at_run_time() -> None:
    b = Builder("main")
    x = b.arg("x", "f32", (3, "n"))
    n = b.op("dim_size", x, axis=1)
    assert n.shape == () and n.dtype == dtypes.i64
    module = b.build(n + 1)
    for size in (0, 1, 13):
        (got,) = tilefold.compile(module, strict=True)(rand(3, size))
        assert got.dtype == np.int64 and int(got) == size + 1
    assert int(run_op("dim_size", rand(4, 9), axis=-2)) == 4
    with pytest.raises(ShapeError):
        run_op("dim_size", rand(4), axis=1)


# --- index_put ---------------------------------------------------------------------------------


def test_index_put_writes_rows_like_numpy() -> None:
    cache, rows = rand(2, 3, 10, 4), rand(2, 3, 2, 4)
    pos = np.array([7, -1])
    got = run_op("index_put", cache, rows, pos, axes=[2])
    expected = cache.copy()
    expected[:, :, pos] = rows
    assert got.tobytes() == expected.tobytes()
    assert not np.shares_memory(got, cache)


def test_index_put_broadcasts_values_and_the_last_repeated_write_wins() -> None:
    x = rand(5, 6)
    got = run_op("index_put", x, np.float32(2.5), np.array([1, 3]), np.array([0, 5]), axes=[0, 1])
    expected = x.copy()
    expected[[1, 3], [0, 5]] = 2.5
    assert got.tobytes() == expected.tobytes()
    got = run_op("index_put", x, np.arange(12, dtype=np.float32).reshape(2, 6),
                 np.array([4, 4]), axes=[0])
    assert (got[4] == np.arange(6, 12)).all() and (got[:4] == x[:4]).all()


def test_index_put_refuses_bad_input() -> None:
    x = rand(4, 3)
    with pytest.raises(ShapeError, match=r"index_put: index out of range \[-4, 4\)"):
        run_op("index_put", x, rand(1, 3), np.array([4]), axes=[0])
    with pytest.raises(DTypeError, match="dtype"):
        run_op("index_put", x, rand(1, 3, dt=np.float64), np.array([0]), axes=[0])
    with pytest.raises(ShapeError, match="broadcast"):
        run_op("index_put", x, rand(2, 2), np.array([0, 1]), axes=[0])


def _static_cache(scaled: bool = False):
    """One decode step's cache write, `cache[:, :, pos] = kv`, and the sum over the cache rows;
    `scaled`: the write goes into `cache * 2`, an intermediate, and only the sum is returned."""
    b = Builder("main")
    cache = b.arg("cache", "f32", (1, 2, 16, 8))
    kv, pos = b.arg("kv", "f32", (1, 2, 1, 8)), b.arg("pos", "i64", (1,))
    written = b.op("index_put", cache * 2.0 if scaled else cache, kv, pos, axes=[2])
    summed = b.op("reduce_sum", written, axes=[2])
    return b.build(summed) if scaled else b.build(written, summed)


def _expected(cache, kv, pos, scale=1.0):
    out = cache * np.float32(scale)
    out[:, :, pos] = kv
    return out, out.astype(np.float64).sum(axis=2)


def test_a_donated_cache_is_written_in_place() -> None:
    graph = tilefold.compile(_static_cache(), strict=True, donate={0: 0})
    cache, kv, pos = rand(1, 2, 16, 8), rand(1, 2, 1, 8), np.array([5])
    expected, total = _expected(cache, kv, pos)
    written, summed = graph(cache, kv, pos)
    assert written is cache  # the caller's own array, updated
    assert cache.tobytes() == expected.tobytes()
    assert_close(summed, total, dtype="f32", reduced=16)
    assert "in place" in graph.plan_for(cache.shape, kv.shape, pos.shape).layout.values()
    again = rand(1, 2, 1, 8)  # the next step writes the next row into the same array
    expected[:, :, [6]] = again
    assert graph(cache, again, np.array([6]))[0] is cache
    assert cache.tobytes() == expected.tobytes()


def test_an_undonated_cache_is_left_alone() -> None:
    graph = tilefold.compile(_static_cache(), strict=True)
    cache, kv, pos = rand(1, 2, 16, 8), rand(1, 2, 1, 8), np.array([-3])
    before = cache.copy()
    expected, _ = _expected(cache, kv, pos)
    written, _ = graph(cache, kv, pos)
    assert not np.shares_memory(written, cache) and cache.tobytes() == before.tobytes()
    assert written.tobytes() == expected.tobytes()
    assert "in place" not in graph.plan_for(cache.shape, kv.shape, pos.shape).layout.values()


def test_an_intermediate_is_updated_in_place_without_donation() -> None:
    graph = tilefold.compile(_static_cache(scaled=True), strict=True)
    cache, kv, pos = rand(1, 2, 16, 8), rand(1, 2, 1, 8), np.array([0])
    before = cache.copy()
    _, total = _expected(cache, kv, pos, scale=2.0)
    (summed,) = graph(cache, kv, pos)
    assert_close(summed, total, dtype="f32", reduced=16)
    assert cache.tobytes() == before.tobytes()
    assert "in place" in graph.plan_for(cache.shape, kv.shape, pos.shape).layout.values()
    with pytest.raises(ShapeError, match="out of range"):
        graph(cache, kv, np.array([16]))


def test_a_growing_cache_keeps_a_bounded_number_of_plans() -> None:
    """One plan per cache length would hold every length's buffers: only the recent are kept,
    and a length seen again is planned again, still right."""
    from tilefold.compiler import MAX_PLANS

    graph = tilefold.compile(parse_module(_cache_append()), strict=True)
    new = rand(1, 4)
    for past in [*range(MAX_PLANS + 4), 0]:
        x = rand(past, 4)
        (got,) = graph(x, new)
        assert got.tobytes() == np.concatenate([x, new]).tobytes()
        assert len(graph._plans) <= MAX_PLANS


def test_plans_for_new_lengths_share_the_kernels_whose_sizes_did_not_change() -> None:
    """A decode step at each cache length is a new plan; its weight GEMM is the same problem
    at every length, so it is decided (and its weight packed) once; the concat is decided per
    length. Every length still gives NumPy's answer."""
    from tilefold.strategy.methods import blocks

    b = Builder("main")
    past, new = b.arg("past", "f32", ("s0", 16)), b.arg("new", "f32", (1, 16))
    weight = rand(16, 16)
    proj = b.op("matmul", new, b.constant(weight))
    grown = b.op("concat", past, proj, axis=0)
    graph = tilefold.compile(b.build(grown, proj), strict=True)
    x = rand(1, 16)
    packed_before = set(blocks._PACKED)  # keys: an earlier test's weight may die meanwhile
    chosen = []
    for length in (0, 3, 17, 3):
        cache = rand(length, 16)
        got_cache, got_proj = graph(cache, x)
        want = x.astype(np.float64) @ weight
        assert_close(got_proj, want, dtype="f32", reduced=16)
        assert_close(got_cache, np.concatenate([cache, want]), dtype="f32", reduced=16)
        by_op = {d.problem.names: d for d in graph.decisions((length, 16), (1, 16))}
        chosen.append((by_op[("matmul",)], by_op[("concat",)]))
    gemms, concats = zip(*chosen, strict=True)
    assert all(g is gemms[0] for g in gemms)
    assert len({id(c) for c in concats}) == 3 and concats[1] is concats[3]
    prepacked = (gemms[0].winner.config or {}).get("prepack", False)
    assert len(set(blocks._PACKED) - packed_before) == int(prepacked)


def test_gemms_of_one_weight_at_many_lengths_keep_no_packed_copy() -> None:
    """Prefill at each prompt length is a new GEMM problem; none of them keeps a packed copy
    of the weight (symbolic rows: the graph serves one row too, whose GEMV reads the weight
    in place, so each GEMM packs it per call rather than hold the model's weights twice)."""
    from tilefold.strategy.methods import blocks

    b = Builder("main")
    x = b.arg("x", "f32", ("s0", 24))
    weight = rand(24, 40)
    graph = tilefold.compile(b.build(b.op("matmul", x, b.constant(weight))), strict=True)
    before = set(blocks._PACKED)  # keys: an earlier test's weight may die meanwhile
    decisions = set()
    for rows in (5, 9, 64):
        a = rand(rows, 24)
        (got,) = graph(a)
        assert_close(got, a.astype(np.float64) @ weight, dtype="f32", reduced=24)
        (d,) = graph.decisions((rows, 24))
        assert d.winner.method == "blocks.gemm" and not d.winner.config["prepack"]
        decisions.add(id(d))
    assert len(decisions) == 3 and not set(blocks._PACKED) - before
