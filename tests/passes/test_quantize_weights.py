"""quantize-weights and the weight-only GEMM it hands to blocks.gemm: the rewrite (which weights,
what codes), the compiled result against float64 NumPy on the dequantized weights (the
kernel's own error: f32 rounding of a K-term dot product), and the quantization error itself
(bounded by half a code step per weight)."""

from __future__ import annotations

import numpy as np
import pytest

import tilefold as tf
from tests.tolerances import assert_close
from tilefold import dtypes
from tilefold.errors import DTypeError, PassError
from tilefold.ir import Builder, interpret
from tilefold.ir.ops.quant import Quantize
from tilefold.passes import PassManager
from tilefold.passes.quantize_weights import quantize_weight

RNG = np.random.default_rng(5)


def _layer(w: np.ndarray, transpose_b: bool, rows=("s0",), epilogue: bool = True):
    b = Builder("main")
    x = b.arg("x", "f32", (*rows, w.shape[1] if transpose_b else w.shape[0]))
    y = b.op("matmul", x, b.constant(w), transpose_b=transpose_b)
    if epilogue:
        y = b.op("mul", y, b.op("sigmoid", y))  # a SiLU the GEMM's row program applies
    return b.build(y)


def _dequantized(w: np.ndarray, axis: int, fmt: str) -> np.ndarray:
    codes, scale = quantize_weight(w, axis, fmt)
    step = np.repeat(scale.astype(np.float64), w.shape[axis] // scale.shape[axis], axis=axis)
    return codes.astype(np.float64) * step


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_the_rewrite_stores_codes_and_leaves_small_or_odd_weights(fmt):
    big, small = RNG.standard_normal((96, 64)), RNG.standard_normal((8, 64))
    # K = 49: not a whole number of int4 groups of 32 (int8 takes it: one scale a channel)
    odd = RNG.standard_normal((96, 49))
    b = Builder("main")
    x = b.arg("x", "f32", (2, 64))
    outs = [b.op("matmul", x, b.constant(w.astype(np.float32)), transpose_b=True)
            for w in (big, small)]
    outs.append(b.op("matmul", b.arg("z", "f32", (2, 49)), b.constant(odd.astype(np.float32)),
                     transpose_b=True))
    pm = PassManager(f"quantize-weights{{format={fmt} min-elements=1024}},dce")
    module = pm.run(b.build(*outs))
    want = 2 if fmt == "int8" else 1
    assert pm.passes[0].stats == {"num-quantized": want}
    deqs = [op for op in module.walk() if op.name == "dequantize"]
    assert len(deqs) == want
    codes = deqs[0].operands[0].defining_op.attrs["value"]
    scale = deqs[0].operands[1].defining_op.attrs["value"]
    assert str(codes.dtype) == ("int8" if fmt == "int8" else "int4") and codes.shape == (96, 64)
    assert scale.shape == ((96, 1) if fmt == "int8" else (96, 2))
    assert np.array_equal(scale.astype(np.float16).astype(np.float32), scale)  # f16 scales
    a, z = RNG.standard_normal((2, 64)).astype(np.float32), RNG.standard_normal((2, 49))
    got = interpret(module, a, z.astype(np.float32))
    assert_close(got[0], a.astype(np.float64) @ _dequantized(big.astype(np.float32), 1, fmt).T,
                 dtype="f32", reduced=64)
    if fmt == "int8":  # odd K decodes like any other (groups padded inside the kernel)
        zq = _dequantized(odd.astype(np.float32), 1, fmt)
        assert_close(got[2], z.astype(np.float32).astype(np.float64) @ zq.T, dtype="f32",
                     reduced=49)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("transpose_b", [True, False])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_compiled_weight_only_gemm_matches_numpy_on_the_dequantized_weight(fmt, transpose_b, m):
    n, k = 160, 96 if fmt == "int4" else 98  # int8: K = 2 x 7 x 7
    w = RNG.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    graph = tf.compile(_layer(w, transpose_b), strict=True, weights=fmt)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    (got,) = graph(x)
    (d,) = graph.decisions((m, k))
    assert d.winner.method == "blocks.gemm" and d.winner.config["weights"] == \
        ("i8" if fmt == "int8" else "i4")
    wq = _dequantized(w, 1 if transpose_b else 0, fmt)
    y = x.astype(np.float64) @ (wq.T if transpose_b else wq)
    assert_close(got, y / (1 + np.exp(-y)), dtype="f32", reduced=k,
                 scale=np.abs(x.astype(np.float64)) @ np.abs(wq.T if transpose_b else wq))


@pytest.mark.parametrize(("fmt", "lo", "hi"), [("int8", -127, 127), ("int4", -8, 7)])
def test_quantization_error_is_half_a_code_step(fmt, lo, hi):
    """What the user trades: each weight moves at most half its block's stored step (the
    smallest step that fits the block into the codes' range, max(max w / hi, min w / lo),
    rounded to the nearest f16, so within 2**-11 of it); int4 blocks use all 16 codes."""
    w = RNG.standard_normal((64, 128)).astype(np.float32)
    wq = _dequantized(w, 1, fmt)
    codes, scale = quantize_weight(w, 1, fmt)
    group = 128 if fmt == "int8" else 32
    blocks = w.reshape(64, -1, group).astype(np.float64)
    fit = np.maximum(blocks.max(axis=2, keepdims=True) / hi, blocks.min(axis=2, keepdims=True) / lo)
    assert np.all(np.abs(scale[..., None] - fit) <= 2.0**-11 * fit)
    assert codes.astype(np.int64).min() == lo or fmt == "int8"
    assert np.array_equal(codes.astype(np.int64), Quantize.reference(
        [w, scale], {"dtype": dtypes.i8 if fmt == "int8" else dtypes.i4}).astype(np.int64))
    t_codes, t_scale = quantize_weight(np.ascontiguousarray(w.T), 0, fmt)  # along axis 0
    assert np.array_equal(t_codes, codes.T) and np.array_equal(t_scale, scale.T)
    bound = np.broadcast_to(scale[..., None] / 2, (64, 128 // group, group)).reshape(64, 128)
    assert np.all(np.abs(wq - w) <= bound * (1 + 1e-6))
    graph = tf.compile(_layer(w, True, rows=(4,), epilogue=False), strict=True, weights=fmt)
    x = RNG.standard_normal((4, 128)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    (got,) = graph(x)
    assert np.abs(got - exact).max() <= np.abs(x).sum(axis=1).max() * bound.max() * 1.01


def test_bad_formats_are_clear_errors():
    w = RNG.standard_normal((64, 64)).astype(np.float32)
    with pytest.raises(DTypeError, match="weights='int3'"):
        tf.compile(_layer(w, True), weights="int3")
    with pytest.raises(PassError, match="format 'fp2'"):
        PassManager("quantize-weights{format=fp2}").run(_layer(w, True))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_int8_activations_join_where_allowed_and_the_host_has_an_integer_dot(fmt, monkeypatch):
    """With TILEFOLD_WEIGHT_ACTIVATIONS=int8 the integer-dot candidate joins the float one on
    a host with an integer dot (VNNI, where it wins the cost model, or AVX2's pmaddubsw); the
    winner's result matches float64 NumPy on the activations it used (`q8_activations` for
    int8) to f32 rounding. Without an integer dot it is not offered."""
    from tilefold.codegen.llvm.lowp.weight_only import dot_instruction, layout_kind
    from tilefold.quant.accuracy import corrected_matmul_bound, dequantized_activations
    from tilefold.target import host_target

    monkeypatch.setenv("TILEFOLD_WEIGHT_ACTIVATIONS", "int8")
    n, k, m = 160, 96, 3
    w = RNG.standard_normal((n, k)).astype(np.float32)
    graph = tf.compile(_layer(w, True, rows=(m,), epilogue=False), strict=True, weights=fmt)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    (got,) = graph(x)
    (d,) = graph.decisions((m, k))
    offered = {c.config.get("activations") for c in d.candidates if c.method == "blocks.gemm"}
    host = host_target()
    dot = dot_instruction(layout_kind("i4", False, host)[0], host)
    assert offered == ({"f32", "int8"} if dot else {"f32"})
    wq = _dequantized(w, 1, fmt).T
    won = d.winner.config["activations"]
    xq = dequantized_activations(x) if won == "int8" else x.astype(np.float64)
    if dot == "vnni":
        assert won == "int8"
    assert (np.abs(got - xq @ wq) <= corrected_matmul_bound(xq, wq, np.zeros_like(wq))).all()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_weight_only_gemv_replays_natively(fmt):
    """Called again and again on one input array (a decode step), the weight-only GEMV and its
    epilogue are recorded as native calls and replayed in one; each answer follows the input's
    contents, written in place between calls."""
    from tilefold.compiler import Recording
    from tilefold.runtime.replay import Replay

    w = RNG.standard_normal((160, 96)).astype(np.float32)
    graph = tf.compile(_layer(w, True, rows=(1,)), strict=True, weights=fmt)
    wq = _dequantized(w, 1, fmt)
    x = np.empty((1, 96), np.float32)
    for _ in range(4):
        x[...] = RNG.standard_normal((1, 96))
        (got,) = graph(x)
        y = x.astype(np.float64) @ wq.T
        assert_close(got, y / (1 + np.exp(-y)), dtype="f32", reduced=96,
                     scale=np.abs(x.astype(np.float64)) @ np.abs(wq.T))
    (plan,) = graph._plans.values()
    assert isinstance(plan.replay, Recording) and plan.replay.native_steps == len(plan.steps)
    assert [type(s) for s in plan.replay.segments] == [Replay]


@pytest.mark.parametrize("head", ["int8", "int4"])
def test_a_vocabulary_head_takes_the_head_format(head):
    """A returned projection to >= HEAD_RATIO times more features than it reads (an LM head,
    here through a reshape) is stored in `head-format`; the same projection feeding more
    computation, or a narrower returned one, takes `format`; both still compute NumPy's
    answer on their dequantized weights."""
    from tilefold.passes.quantize_weights import HEAD_RATIO

    k = 64
    wide = RNG.standard_normal((HEAD_RATIO * k, k)).astype(np.float32)
    narrow = RNG.standard_normal((2 * k, k)).astype(np.float32)
    b = Builder("main")
    x = b.arg("x", "f32", (3, k))
    logits = b.op("reshape", b.op("matmul", x, b.constant(wide), transpose_b=True),
                  shape=[1, 3, HEAD_RATIO * k])
    inner = b.op("matmul", x, b.constant(wide), transpose_b=True)
    outs = [logits, b.op("mul", inner, inner), b.op("matmul", x, b.constant(narrow),
                                                    transpose_b=True)]
    pm = PassManager(f"quantize-weights{{format=int4 head-format={head} min-elements=1024}},dce")
    module = pm.run(b.build(*outs))
    codes = [str(op.operands[0].defining_op.attrs["value"].dtype)
             for op in module.walk() if op.name == "dequantize"]
    assert sorted(codes) == sorted([head, "int4", "int4"])
    a = RNG.standard_normal((3, k)).astype(np.float32)
    got = interpret(module, a)
    wide_q = _dequantized(wide, 1, head)
    assert_close(got[0].reshape(3, -1), a.astype(np.float64) @ wide_q.T, dtype="f32", reduced=k)
    assert_close(got[2], a.astype(np.float64) @ _dequantized(narrow, 1, "int4").T, dtype="f32",
                 reduced=k)


def test_a_weight_is_quantized_once_for_every_graph_that_holds_it():
    """Two graphs multiplying by the same weight (a model's prompt and decode graphs, each with
    its own array of the weight's bytes) share one set of codes and scales, and so one
    weight-only layout; a weight with other bytes gets its own."""
    w = RNG.standard_normal((160, 96)).astype(np.float32)
    other = w.copy()
    other[3, 5] += 1.0

    def codes_of(weight):
        pm = PassManager("quantize-weights{format=int4},dce")
        module = pm.run(_layer(weight, True, rows=(2,)))
        (deq,) = [op for op in module.walk() if op.name == "dequantize"]
        return [v.defining_op.attrs["value"] for v in deq.operands]

    first, again, changed = codes_of(w), codes_of(w.copy()), codes_of(other)
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert first[0] is not changed[0]
    assert not np.array_equal(first[0].astype(np.int8), changed[0].astype(np.int8))
