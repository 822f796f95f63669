"""canonicalize: the rule table is well-formed, exact where it says so, and reaches a fixpoint."""

from __future__ import annotations

import itertools
import logging

import ml_dtypes
import numpy as np
import pytest

from tests.tolerances import assert_close
from tilefold import dtypes
from tilefold.dtypes import DType
from tilefold.ir import OPS, Builder, interpret, parse_module
from tilefold.passes import RULES, run_pipeline
from tilefold.passes.casts import holds


def test_rules_name_real_ops_and_distinct_identities() -> None:
    assert all(name in OPS for rule in RULES for name in rule.names)
    identities = [rule.identity for rule in RULES]
    assert len(identities) == len(set(identities))


def ops_after(text: str, pipeline: str = "canonicalize") -> list[str]:
    m = parse_module(text)
    run_pipeline(m, pipeline)
    return [op.name for op in m.functions["f"].ops]


def add_const(op: str, value: str) -> str:
    return f"""func @f(%x: f32[3]) -> (f32[3]) {{
  %c = constant() {{value = dense<f32[] [{value}]>}} : f32[]
  %0 = {op}(%x, %c) : f32[3]
  return(%0)
}}"""


@pytest.mark.parametrize(
    ("op", "zero", "folds", "strict_folds"),
    [
        ("add", "0.0", True, False),  # -0.0 + 0.0 is +0.0
        ("add", "-0.0", True, True),
        ("sub", "0.0", True, True),
        ("sub", "-0.0", True, False),  # -0.0 - -0.0 is +0.0
    ],
)
def test_signed_zeros(op: str, zero: str, folds: bool, strict_folds: bool) -> None:
    text = add_const(op, zero)
    assert (ops_after(text) == ["return"]) is folds
    strict = ops_after(text, "canonicalize{strict-signed-zeros=true}")
    assert (strict == ["return"]) is strict_folds
    if strict_folds:  # then it is exact bit for bit, on -0.0 too
        x = np.array([-0.0, 0.0, np.nan], np.float32)
        got = interpret(parse_module(text), x)[0]
        assert np.signbit(got[:2]).tolist() == np.signbit(x[:2]).tolist()


def test_float_times_zero_stays_because_of_nan_and_inf() -> None:
    assert "mul" in ops_after(add_const("mul", "0.0"))
    x = np.array([np.nan, np.inf, 1.0], np.float32)
    assert np.isnan(interpret(parse_module(add_const("mul", "0.0")), x)[0][:2]).all()


def test_max_iterations_bounds_the_work(caplog) -> None:
    text = """func @f(%x: f32[2,3]) -> (f32[2,3]) {
  %0 = neg(%x) : f32[2,3]
  %1 = neg(%0) : f32[2,3]
  return(%1)
}"""
    with caplog.at_level(logging.WARNING, logger="tilefold.passes"):
        assert ops_after(text, "canonicalize{max-iterations=1}") == ["return"]
    assert "did not converge in 1 iterations" in caplog.text
    caplog.clear()
    ops_after(text, "canonicalize{max-iterations=2}")
    assert "did not converge" not in caplog.text


# -- casts ---------------------------------------------------------------------------------

CAST_DTYPES = dtypes.ALL_DTYPES


@pytest.mark.parametrize(
    ("a", "b", "exact"),
    [
        ("f16", "f32", True),
        ("bf16", "f32", True),
        ("f32", "f64", True),
        ("fp8e4m3", "f16", True),
        ("fp8e4m3", "bf16", True),
        ("fp4e2m1", "fp8e4m3", True),
        ("f32", "f16", False),
        ("bf16", "f16", False),  # range
        ("f16", "bf16", False),  # precision
        ("f32", "fp8e4m3", False),
        ("f16", "fp8e4m3", False),  # fp8e4m3 has no inf
        ("i8", "f16", True),
        ("u8", "bf16", True),
        ("i32", "f32", False),
        ("i32", "f64", True),
        ("i64", "f64", False),
        ("u8", "i32", True),
        ("u8", "i8", False),
        ("i4", "i8", True),
        ("bool", "fp4e2m1", True),
        ("f32", "i64", False),
        ("i8", "bool", False),
    ],
)
def test_holds(a: str, b: str, exact: bool) -> None:
    assert holds(dtypes.dtype(a), dtypes.dtype(b)) is exact


def every_value(dt: DType) -> np.ndarray:
    """All values of a small dtype; specials and a spread of values for a wide one."""
    if dt.kind == "bool":
        return np.array([False, True])
    if dt.bits <= 8:
        codes = np.arange(2**dt.bits, dtype=np.uint8)
        if dt.kind == "int":  # two's complement of the low `bits` bits
            signed = codes.astype(np.int64) - 2**dt.bits * (codes >= 2 ** (dt.bits - 1))
            return signed.astype(dt.np_dtype)
        return codes.view(dt.np_dtype)
    if dt.is_integer:
        info = ml_dtypes.iinfo(dt.np_dtype)
        return (
            np.array([info.min, info.min + 1, -300, -1, 0, 1, 200, 70000, info.max], object)
            .clip(info.min, info.max)
            .astype(dt.np_dtype)
        )
    info = ml_dtypes.finfo(dt.np_dtype)
    values = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        np.inf,
        -np.inf,
        np.nan,
        1e-40,
        3.3e38,
        65519.0,
        1e300,
        float(info.max),
        float(info.smallest_subnormal),
        0.1,
        300.7,
        -129.5,
    ]
    with np.errstate(all="ignore"):
        return np.array(values).astype(dt.np_dtype)


def test_cast_chains_fold_only_when_exact() -> None:
    """cast(cast(x: A, B), C) after canonicalize equals before, for every A, B, C."""
    folded = 0
    for a, b, c in itertools.product(CAST_DTYPES, repeat=3):
        x = every_value(a)
        builder = Builder("f")
        arg = builder.arg("x", a, x.shape)
        m = builder.build(arg.astype(b).astype(c))
        before = interpret(m, x)[0]
        run_pipeline(m, "canonicalize")
        folded += len(m.functions["f"].ops) < 3
        after = interpret(m, x)[0]
        assert before.tobytes() == after.tobytes(), f"cast {a} -> {b} -> {c} changed bits"
    assert folded > 100  # the rule is not vacuous


# -- repeat_kv into grouped-query attention -------------------------------------------------

REPEAT_KV = """func @f(%q: f32[2,{h},3,8], %k: f32[2,{hk},11,8], %v: f32[2,{hk},11,8],
                      %m: bool[2,1,3,11]) -> (f32[2,{h},3,8]) {{
  %0 = expand_dims(%k) {{axes = [{axis}]}} : {kx}
  %1 = broadcast_to(%0) {{shape = {wide}}} : f32{wide}
  %2 = reshape(%1) {{shape = [2, {h}, 11, 8]}} : f32[2,{h},11,8]
  %3 = expand_dims(%v) {{axes = [{axis}]}} : {kx}
  %4 = broadcast_to(%3) {{shape = {wide}}} : f32{wide}
  %5 = reshape(%4) {{shape = [2, {h}, 11, 8]}} : f32[2,{h},11,8]
  %6 = scaled_dot_product_attention(%q, %2, %5, %m) : f32[2,{h},3,8]
  return(%6)
}}"""


def _attention64(q, k, v, mask):
    """Attention in float64 NumPy with k and v already one head per query head."""
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v.astype(np.float64)


@pytest.mark.parametrize(("hk", "rep", "tiled"), [(3, 3, False), (2, 4, False), (3, 2, True)])
def test_repeat_kv_folds_into_gqa_attention_with_the_same_values(hk, rep, tiled) -> None:
    """repeat_kv (head h reads k's head h // rep) folds and computes what it did; tiling the
    heads (h reads h % hk: the unit axis before the heads) is not repeat_kv and stays."""
    h = hk * rep
    wide = [2, rep, hk, 11, 8] if tiled else [2, hk, rep, 11, 8]
    kx = f"f32[2,1,{hk},11,8]" if tiled else f"f32[2,{hk},1,11,8]"
    text = REPEAT_KV.format(h=h, hk=hk, axis=1 if tiled else 2, kx=kx,
                            wide=str(wide).replace(" ", ""))
    rng = np.random.default_rng(hk * rep)
    q = rng.standard_normal((2, h, 3, 8), np.float32)
    k, v = (rng.standard_normal((2, hk, 11, 8), np.float32) for _ in range(2))
    mask = rng.random((2, 1, 3, 11)) > 0.3
    mask[..., 0] = True  # no fully masked row: the float64 formula has no zeros rule
    heads = np.arange(h) % hk if tiled else np.arange(h) // rep
    want = _attention64(q, k[:, heads], v[:, heads], mask)
    m = parse_module(text)
    run_pipeline(m, "canonicalize")
    (sdpa,) = [op for op in m.functions["f"].ops if op.name == "scaled_dot_product_attention"]
    assert sdpa.attr("enable_gqa") is (not tiled)
    assert (sdpa.operands[1].name == "k") is (not tiled)
    got = interpret(m, q, k, v, mask)[0]
    assert_close(got, want, dtype="f32", reduced=11)
