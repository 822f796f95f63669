"""The op-lowering table (`codegen/lower`): it covers every elementwise, reduction and norm op
(or says why not), agrees with the IR's `lowered` trait, and both of its consumers (kernel IR
for memory-bound groups, row programs for GEMM epilogues) compute every rule right, against
float64 NumPy."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tests.tolerances import tolerance
from tilefold.codegen.llvm.rowprog import Emitter
from tilefold.codegen.lower import PRIMITIVES, RULES, lower_op
from tilefold.codegen.rowprog import build_program
from tilefold.ir import OPS, Builder, parse_module
from tilefold.passes import PassManager
from tilefold.strategy import METHODS, Problem, context, register_builtin_methods

RNG = np.random.default_rng(15)
ERF = np.vectorize(math.erf, otypes=[np.float64])
FAMILIES = ("tilefold.ir.ops.elementwise", "tilefold.ir.ops.reduce", "tilefold.ir.ops.nn")

# Ops of the elementwise, reduction and norm families that no kernel computes, and why.
NOT_LOWERED = {
    "cumsum": "a prefix sum along an axis is neither a map nor a reduction; it runs in NumPy",
}


def _family_ops() -> list[str]:
    return sorted(n for n, d in OPS.items() if d.__module__ in FAMILIES
                  or d.traits & {"elementwise", "reduction"})


def test_every_family_op_is_lowered_or_listed_with_a_reason():
    missing = [n for n in _family_ops() if n not in RULES and n not in NOT_LOWERED]
    assert not missing, f"no lowering rule and no reason in NOT_LOWERED: {missing}"
    assert not set(NOT_LOWERED) & set(RULES), "listed as not lowered, yet the table has a rule"


def test_the_lowered_trait_and_the_table_agree():
    """Fusion reads the trait (passes sit below codegen); codegen lowers by the table."""
    for name, opdef in OPS.items():
        if "lowered" in opdef.traits:
            assert name in RULES, f"'{name}' declares the lowered trait but has no rule"
    for name in RULES:
        assert name in OPS, f"rule for unknown op '{name}'"
        trait = OPS[name].traits
        assert "lowered" in trait or "layout" in trait, (
            f"'{name}' has a rule but no lowered trait: fusion would never group it")


class _Recorder:
    """A lowering context that records the primitives a rule emits."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def call(self, prim, *xs):
        assert PRIMITIVES[prim].arity == len(xs), prim
        self.used.add(prim)
        return (prim, xs)

    def const(self, value):
        return ("const", value)

    def reduce(self, op, kind, x):
        assert kind in ("sum", "max", "min")
        return ("reduce", kind, x)

    def inv_count(self, op):
        return ("inv_count",)

    def scalar(self, op, index):
        return None


def _instance(name: str, dtype: str = "f32", **given):
    """One instance of op `name` over [3, 4] operands of `dtype` (attributes `given`)."""
    b = Builder("main")
    x = b.arg("x", dtype, (3, 4))
    opdef = OPS[name]
    if name in ("layer_norm", "rms_norm"):
        extra = [b.arg(f"w{i}", dtype, (4,)) for i in range(len(opdef.operands) - 1)]
    elif name == "where":
        extra = [b.arg("y", dtype, (3, 4)), b.arg("z", dtype, (3, 4))]
        x = b.arg("c", "bool", (3, 4))
    else:
        extra = [b.arg(f"y{i}", dtype, (3, 4)) for i in range(len(opdef.operands) - 1)]
    attrs = {"expand_dims": {"axes": [0]}, "squeeze": {"axes": [0]},
             "transpose": {"perm": [1, 0]}, "broadcast_to": {"shape": [2, 3, 4]},
             "cast": {"dtype": "bf16"}}.get(name, given)
    if name == "squeeze":
        x = b.arg("s", dtype, (1, 3, 4))
    b.op(name, x, *extra, **attrs)
    return b.function.ops[-1]


def test_every_primitive_is_emitted_by_some_rule():
    """So the numeric tests below, which run every rule, reach every primitive of both
    emitters."""
    cx = _Recorder()
    for name in RULES:
        for dtype in ("f32", "bf16", "f16"):
            if dtype != "f32" and name in ("and", "or", "where"):
                continue
            op = _instance(name, dtype if name not in ("and", "or") else "bool")
            lower_op(cx, op, [("arg", i) for i in range(len(op.operands))])
    lower_op(cx, _instance("gelu", approximate="tanh"), [("arg", 0)])
    assert cx.used == set(PRIMITIVES), set(PRIMITIVES) - cx.used


def _gelu(c):
    return 0.5 * c * (1 + ERF(c / math.sqrt(2)))


def _gelu_tanh(c):
    return 0.5 * c * (1 + np.tanh(math.sqrt(2 / math.pi) * (c + 0.044715 * c ** 3)))


def _bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def _f16(x):
    return x.astype(np.float16).astype(np.float64)


def _mean(c):
    return c.mean(-1, keepdims=True)


def _softmax(c):
    e = np.exp(c - c.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


T, B = "f32[{m},33]", "bool[{m},33]"
POSITIVE = {"log": np.log, "sqrt": np.sqrt, "rsqrt": lambda p: 1 / np.sqrt(p)}
UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "reciprocal": lambda c: 1 / c,
    "tanh": np.tanh, "erf": ERF, "sigmoid": lambda c: 1 / (1 + np.exp(-c)),
    "relu": lambda c: np.maximum(c, 0), "silu": lambda c: c / (1 + np.exp(-c)),
    "sin": np.sin, "cos": np.cos, "floor": np.floor, "gelu": _gelu,
}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "max": np.maximum, "min": np.minimum}
COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}
REDUCE = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min,
          "reduce_mean": np.mean}

# case: (IR lines from %c (the space) and %y [33] to %r, NumPy of (c, y), reduced length)
CASES = {
    **{u: (f"%r = {u}(%c) : {T}", lambda c, y, f=f: f(c), 1) for u, f in UNARY.items()},
    **{u: (f"%p = abs(%c) : {T}\n%r = {u}(%p) : {T}", lambda c, y, f=f: f(np.abs(c)), 1)
       for u, f in POSITIVE.items()},
    "softplus": (f"%r = softplus(%c) {{beta = 2.0, threshold = 4.0}} : {T}",
                 lambda c, y: np.where(2 * c > 4, c, np.logaddexp(0, 2 * c) / 2), 1),
    "gelu_tanh": (f'%r = gelu(%c) {{approximate = "tanh"}} : {T}',
                  lambda c, y: _gelu_tanh(c), 1),
    **{o: (f"%r = {o}(%c, %y) : {T}", lambda c, y, f=f: f(c, y), 1) for o, f in BINARY.items()},
    "pow": (f"%p = abs(%c) : {T}\n%r = pow(%p, %y) : {T}",
            lambda c, y: np.power(np.abs(c), y), 1),
    **{o: (f"%m = {o}(%c, %y) : {B}\n%r = where(%m, %c, %y) : {T}",
           lambda c, y, f=f: np.where(f(c, y), c, y), 1) for o, f in COMPARE.items()},
    **{o: (f"%n = neg(%c) : {T}\n%a = lt(%n, %y) : {B}\n%b = lt(%n, %c) : {B}\n"
           f"%m = {o}(%a, %b) : {B}\n%r = where(%m, %c, %y) : {T}",
           lambda c, y, f=f: np.where(f(-c < y, -c < c), c, y), 1)
       for o, f in (("and", np.logical_and), ("or", np.logical_or))},
    "cast_bool": (f"%m = cast(%c) {{dtype = bool}} : {B}\n%r = cast(%m) {{dtype = f32}} : {T}",
                  lambda c, y: (c != 0).astype(np.float64), 1),
    # bf16/f16 values inside a kernel: each op's result is rounded to its dtype
    **{f"{d}_inside": (f"%h = cast(%c) {{dtype = {d}}} : {d}[{{m}},33]\n"
                       f"%s = mul(%h, %h) : {d}[{{m}},33]\n%r = cast(%s) {{dtype = f32}} : {T}",
                       lambda c, y, r=r: r(r(c) ** 2), 1)
       for d, r in (("bf16", _bf16), ("f16", _f16))},
    **{o: (f"%s = {o}(%c) {{axes = [1], keepdims = true}} : f32[{{m}},1]\n"
           f"%r = sub(%c, %s) : {T}", lambda c, y, f=f: c - f(c, -1, keepdims=True), 33)
       for o, f in REDUCE.items()},
    "softmax": (f"%r = softmax(%c) : {T}", lambda c, y: _softmax(c), 33),
    "log_softmax": (f"%r = log_softmax(%c) : {T}", lambda c, y: np.log(_softmax(c)), 33),
    "layer_norm": (f"%r = layer_norm(%c, %y, %y) : {T}", lambda c, y: (c - _mean(c)) / np.sqrt(
        _mean((c - _mean(c)) ** 2) + 1e-5) * y + y, 33),
    "rms_norm": (f"%r = rms_norm(%c, %y) : {T}",
                 lambda c, y: c / np.sqrt(_mean(c * c) + 1e-5) * y, 33),
}


def test_the_cases_run_every_rule_of_a_fusible_op():
    names = {line.split("= ")[1].split("(")[0] for body, _, _ in CASES.values()
             for line in body.split("\n")}
    fusible = {n for n in RULES if "lowered" in OPS[n].traits}
    assert fusible <= names, fusible - names


@pytest.fixture(scope="module", autouse=True)
def _methods():
    register_builtin_methods()


def _run(method: str, text: str, *arrays: np.ndarray) -> np.ndarray:
    """Fuse `text` into one group and run `method`'s kernel for it (no fallback possible)."""
    module = parse_module(text)
    PassManager("fusion").run(module)
    fn = module["main"]
    (op,) = [o for o in fn.ops if o.name == "fused"]
    inputs = [arrays[fn.args.index(v)] for v in op.operands]
    problem = Problem.of(op, [a.shape for a in inputs])
    candidates = METHODS[method].propose(problem, context())
    assert not isinstance(candidates, str), candidates
    (out,) = [np.full(t.shape, np.nan, np.float32) for t in problem.out_types()]
    kernel = candidates[0].build()
    kernel.run(*inputs, out, *kernel.scratch_arrays())
    return out


def _check(case: str, got: np.ndarray, c: np.ndarray, y: np.ndarray) -> None:
    _, numpy, reduced = CASES[case]
    with np.errstate(all="ignore"):
        want = numpy(c.astype(np.float64), y.astype(np.float64))
    if case.endswith("_inside") or case == "cast_bool":
        np.testing.assert_array_equal(got, want)  # exact: every step is exact or rounded once
    else:
        np.testing.assert_allclose(got, want, **tolerance("f32", reduced, scale=10.0))


@pytest.mark.parametrize("case", sorted(CASES))
def test_memory_bound_kernel(case):
    c = (RNG.standard_normal((7, 33)) * 3).astype(np.float32)
    c[0, :4] = [0.0, -0.0, 1e-30, -40.0]
    y = RNG.standard_normal(33).astype(np.float32)
    y[:2] = c[0, :2]  # ties for the comparisons
    body = CASES[case][0].replace("{m}", "7")
    text = (f"func @main(%c: f32[7,33], %y: f32[33]) -> (f32[7,33]) {{\n{body}\n"
            "return(%r)\n}")
    _check(case, _run("autocodegen.kernel", text, c, y), c, y)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gemm_epilogue(case):
    """Quarter-integer inputs make the GEMM exact, so C is the oracle's C."""
    x = (RNG.integers(-8, 9, (5, 24)) / 4).astype(np.float32)
    w = (RNG.integers(-8, 9, (24, 33)) / 4).astype(np.float32)
    y = RNG.standard_normal(33).astype(np.float32)
    body = CASES[case][0].replace("{m}", "5")
    text = ("func @main(%x: f32[5,24], %w: f32[24,33], %y: f32[33]) -> (f32[5,33]) {\n"
            f"%c = matmul(%x, %w) : f32[5,33]\n{body}\nreturn(%r)\n}}")
    c = x.astype(np.float64) @ w.astype(np.float64)
    assert np.array_equal(c, (x @ w).astype(np.float64))
    _check(case, _run("blocks.gemm", text, x, w, y), c.astype(np.float32), y)


def test_a_row_program_computes_a_shared_value_once():
    """softmax's rule asks for exp(x - max) twice (its sum and its result); the epilogue must
    evaluate it once per element, kept in a row buffer across the reduction, as before the
    table (the same loops and row buffers as the hand-written row-program lowering)."""
    text = """func @main(%x: f32[5,24], %w: f32[24,33]) -> (f32[5,33]) {
      %c = matmul(%x, %w) : f32[5,33]
      %r = softmax(%c) : f32[5,33]
      return(%r)
    }"""
    fn = parse_module(text)["main"]
    mm, sm = fn.ops[0], fn.ops[1]
    types = {v: v.type for op in fn.ops for v in (*op.operands, *op.results)}
    prog = build_program(types, {}, [sm], [mm.results[0]], [sm.results[0]], mm.results[0])
    assert [p.op for p in prog.prims.values()].count("exp_nonpositive") == 1
    emitter = Emitter(prog, 8)
    assert emitter.stages == 3 and len(emitter.kept) == 1
