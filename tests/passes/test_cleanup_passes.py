"""cse, dce and constant-fold: what they merge, erase and fold, and what they must leave alone."""

from __future__ import annotations

import numpy as np

from tilefold.ir import interpret, parse_module
from tilefold.passes import PassManager, run_pipeline

REGIONS = """func @f(%x: f32[4]) -> (f32[4], f32[4]) {
  %e = exp(%x) : f32[4]
  %a = fused(%x) : f32[4] region (%r: f32[4]) {
    %0 = exp(%r) : f32[4]
    %1 = exp(%r) : f32[4]
    %dead = tanh(%r) : f32[4]
    %2 = add(%0, %1) : f32[4]
    yield(%2)
  }
  %b = fused(%x) : f32[4] region (%s: f32[4]) {
    %3 = exp(%s) : f32[4]
    %4 = exp(%s) : f32[4]
    %5 = add(%3, %4) : f32[4]
    yield(%5)
  }
  %unused = fused(%x) : f32[4] region (%t: f32[4]) {
    yield(%t)
  }
  return(%a, %b)
}"""


def names(block) -> list[str]:
    return [op.name for op in block.ops]


def test_cse_works_inside_each_region_but_not_across() -> None:
    m = parse_module(REGIONS)
    pm = PassManager("cse")
    pm.run(m)
    fn = m.functions["f"]
    a, b = (op for op in fn.ops if op.name == "fused" and op.results[0].name in ("a", "b"))
    assert names(a.regions[0]) == ["exp", "tanh", "add", "yield"]
    assert names(b.regions[0]) == ["exp", "add", "yield"]
    assert names(fn.body).count("fused") == 3  # region ops themselves are not merged
    assert pm.passes[0].stats == {"num-cse": 2}


def test_cse_merges_chains_and_renames_later_uses_in_one_walk() -> None:
    """A duplicate whose operands are duplicates merges too, and every later use of an erased
    result (a region op's operand, the return) reads the earlier op's."""
    text = """func @f(%x: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %a = neg(%x) : f32[4]
  %b = neg(%x) : f32[4]
  %c = exp(%a) : f32[4]
  %d = exp(%b) : f32[4]
  %e = add(%c, %d) : f32[4]
  %f = add(%d, %c) : f32[4]
  %g = fused(%d, %b) : f32[4] region (%r: f32[4], %s: f32[4]) {
    %0 = mul(%r, %s) : f32[4]
    yield(%0)
  }
  return(%f, %g, %e)
}"""
    m = parse_module(text)
    pm = PassManager("cse")
    pm.run(m)
    fn = m.functions["f"]
    assert names(fn.body) == ["neg", "exp", "add", "fused", "return"]
    assert pm.passes[0].stats == {"num-cse": 3}
    kept = {op.name: op.results[0] for op in fn.body.ops if op.results}
    assert fn.body.ops[3].operands == [kept["exp"], kept["neg"]]
    x = np.linspace(-2.0, 2.0, 4).astype(np.float32)
    for got, want in zip(interpret(m, x), interpret(parse_module(text), x),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def test_dce_erases_dead_ops_in_regions_and_dead_region_ops() -> None:
    m = parse_module(REGIONS)
    pm = PassManager("dce")
    pm.run(m)
    fn = m.functions["f"]
    assert names(fn.body) == ["fused", "fused", "return"]
    assert "tanh" not in names(fn.ops[0].regions[0])
    assert pm.passes[0].stats == {"num-erased": 3}  # %e, %dead, %unused


def test_cse_keeps_float_attributes_that_differ_in_sign_of_zero() -> None:
    m = parse_module("""func @f(%x: f32[2,4], %w: f32[4]) -> (f32[2,4], f32[2,4]) {
  %0 = rms_norm(%x, %w) {eps = 0.0} : f32[2,4]
  %1 = rms_norm(%x, %w) {eps = -0.0} : f32[2,4]
  return(%0, %1)
}""")
    run_pipeline(m, "cse")
    assert names(m.functions["f"].body).count("rms_norm") == 2


def test_cse_merges_large_constants_only_when_every_bit_matches() -> None:
    """Big constants are keyed by their ends: equal ends with another middle stay apart."""
    from tilefold.ir import Builder

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    middle = w.copy()
    middle[32, 7] = -middle[32, 7]
    zero = w.copy()
    zero[40, 3] = 0.0
    negzero = zero.copy()
    negzero[40, 3] = -0.0
    b = Builder()
    x = b.arg("x", "f32", (2, 64))
    outs = [x @ b.constant(c) for c in (w, w.copy(), middle, zero, negzero)]
    m = b.build(*outs)
    ones = np.ones((2, 64), np.float32)
    want = interpret(m, ones)
    run_pipeline(m, "cse")
    constants = [op for op in m.functions["main"].ops if op.name == "constant"]
    assert len(constants) == 4  # only the exact copy of w merged
    for got, ref in zip(interpret(m, ones), want, strict=True):
        np.testing.assert_array_equal(got, ref)


def test_constant_fold_keeps_names_and_locations() -> None:
    m = parse_module("""func @f() -> (i64[4]) {
  %a = arange() {shape = [4], start = 1.0} : i64[4] loc("model.py":7:3)
  %b = mul(%a, %a) : i64[4] loc("model.py":8:3)
  return(%b)
}""")
    run_pipeline(m, "constant-fold,dce")
    (op, _) = m.functions["f"].ops
    assert op.name == "constant" and op.results[0].name == "b"
    assert (op.loc.file, op.loc.line) == ("model.py", 8)
    assert op.attrs["value"].tolist() == [1, 4, 9, 16]


def test_constant_fold_leaves_symbolic_shapes_and_large_results() -> None:
    m = parse_module("""func @f(%x: f32[?n]) -> (i64[?n], f32[300,300]) {
  %a = arange() {shape = [?n]} : i64[?n]
  %c = constant() {value = dense<f32[] [1.0]>} : f32[]
  %big = broadcast_to(%c) {shape = [300, 300]} : f32[300,300]
  return(%a, %big)
}""")
    pm = PassManager("constant-fold{size-limit=1000}")
    pm.run(m)
    assert names(m.functions["f"].body) == ["arange", "constant", "broadcast_to", "return"]
    assert pm.passes[0].stats == {"num-folded": 0, "num-too-large": 1}
    run_pipeline(m, "constant-fold")  # 90000 elements are over the default limit too
    assert names(m.functions["f"].body) == ["arange", "constant", "broadcast_to", "return"]


def test_constant_fold_evaluates_like_the_interpreter() -> None:
    m = parse_module("""func @f() -> (bf16[3]) {
  %a = constant() {value = dense<f32[3] [1.0, 2.0, 3.0]>} : f32[3]
  %b = exp(%a) : f32[3]
  %c = cast(%b) {dtype = bf16} : bf16[3]
  return(%c)
}""")
    expected = interpret(m)[0]
    run_pipeline(m, "constant-fold,dce")
    folded = m.functions["f"].ops[0].attrs["value"]
    assert folded.tobytes() == expected.tobytes() and folded.dtype == expected.dtype
    assert np.isfinite(folded.astype(np.float64)).all()
