"""vecmath against f64 references over the whole f32 range: every exponent, both signs, ±0,
subnormals, ±inf, NaN and random samples, for vectors (AVX-512, AVX2) and scalar tails."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from llvmlite import ir

from tilefold.codegen.llvm import util as U
from tilefold.codegen.llvm.vecmath import MATH_FUNCTIONS, RESTRICTED, ULP_BOUNDS, emit_math
from tilefold.runtime import compile_llvm_ir
from tilefold.target import host_target, named_target

F32 = ir.FloatType()
# Over the whole line; exp_nonpositive has its own test below.
WHOLE_LINE = sorted(set(MATH_FUNCTIONS) - RESTRICTED)
FLT_MAX = float(np.finfo(np.float32).max)
_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    v = 2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    return np.where(np.abs(x) > 20, np.where(x > 0, x, -0.0), x * _sigmoid(v))


# Accurate f64 formulations (the IR references lose precision in tails, e.g. 1 + erf(-8)).
REFERENCES = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "erf": lambda x: _erf(x).astype(np.float64),
    "sigmoid": _sigmoid,
    "silu": lambda x: x * _sigmoid(x),
    "gelu": lambda x: 0.5 * x * _erfc(-x / math.sqrt(2)).astype(np.float64),
    "gelu_tanh": _gelu_tanh,
    "rsqrt": lambda x: 1 / np.sqrt(x),
}
NAN_AT_MINUS_INF = {"silu", "gelu", "gelu_tanh"}  # as the reference interpreter: -inf * 0


def reference(name: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        x = x.astype(np.float64)
        r = REFERENCES[name](x)
    return np.where(x == -np.inf, np.nan, r) if name in NAN_AT_MINUS_INF else r


def ulp_error(y: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|y - exact| in units of the f32 ulp at `exact`; inf/NaN must match exactly (0 or inf)."""
    with np.errstate(all="ignore"):
        y = y.astype(np.float64)
        e = np.floor(np.log2(np.abs(exact)))
        ulp = 2.0 ** (np.maximum(np.where(np.isfinite(e), e, -126), -126) - 23)
        err = np.abs(y - exact) / ulp
    overflow = np.abs(exact) >= FLT_MAX * (1 + 2**-25)
    special = np.isnan(exact) | overflow
    with np.errstate(all="ignore"):
        want = np.where(np.isnan(exact), np.nan, np.sign(exact) * np.inf)
    same = (np.isnan(want) & np.isnan(y)) | (y == want)
    err = np.where(special, np.where(same, 0.0, np.inf), err)
    return np.where(np.isnan(y) & ~special, np.inf, err)


def sweep(seed: int = 0) -> np.ndarray:
    """Every exponent x a few mantissas x both signs, random bit patterns, and dense [-20, 20]."""
    rng = np.random.default_rng(seed)
    exponents = np.arange(256, dtype=np.uint32) << 23
    mantissas = np.concatenate([[0, 1, 2, 0x400000, 0x7FFFFF], rng.integers(0, 1 << 23, 40)])
    grid = (exponents[:, None] | mantissas.astype(np.uint32)[None, :]).ravel()
    random_bits = rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([grid, grid | 0x80000000, random_bits])
    dense = rng.uniform(-20, 20, 100_000).astype(np.float32)
    return np.concatenate([bits.view(np.float32), dense])


def math_module(target, lanes: int):
    """One `void NAME(float* x, float* y, i64 n)` per function: `lanes`-wide body, scalar tail."""
    mod = ir.Module("vecmath_test")
    vty = ir.VectorType(F32, lanes).as_pointer()
    for name in MATH_FUNCTIONS:
        fn = ir.Function(mod, ir.FunctionType(U.void, [F32.as_pointer()] * 2 + [U.i64]), name)
        b = ir.IRBuilder(fn.append_basic_block())
        x, y, n = fn.args
        full = b.mul(b.sdiv(n, U.const(lanes)), U.const(lanes))
        with U.for_range(b, U.const(0), full, lanes) as i:
            v = b.load(b.bitcast(b.gep(x, [i]), vty), align=4)
            b.store(emit_math(b, name, v, target.features), b.bitcast(b.gep(y, [i]), vty),
                    align=4)
        with U.for_range(b, full, n) as i:
            b.store(emit_math(b, name, b.load(b.gep(x, [i]))), b.gep(y, [i]))
        b.ret_void()
    return compile_llvm_ir(str(mod), target, name=f"vecmath_test_{lanes}")


TARGETS = {"host": host_target, "x86-64-v3": lambda: named_target("x86-64-v3")}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def compiled(request):
    target = TARGETS[request.param]()
    if not target.is_host():
        pytest.skip(f"{target.name} cannot run here")
    return math_module(target, target.vector_bits // 32)


@pytest.mark.parametrize("name", WHOLE_LINE)
def test_ulp_bound(compiled, name):
    x = sweep()
    fn = compiled.function(name, None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    y = np.empty_like(x)
    fn(x.ctypes.data, y.ctypes.data, x.size)
    err = ulp_error(y, reference(name, x))
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUNDS[name], (
        f"{name}({x[worst]!r}) = {y[worst]!r}, exact {reference(name, x[worst:worst + 1])[0]!r}: "
        f"{err[worst]:.2f} ulp > bound {ULP_BOUNDS[name]}"
    )


@pytest.mark.parametrize("name", sorted(MATH_FUNCTIONS))
def test_scalar_tail_matches_vector(compiled, name):
    """The scalar path (tails) computes bit-for-bit what the vector path does."""
    x = sweep(seed=1)[:4099]
    fn = compiled.function(name, None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    whole, one_by_one = np.empty_like(x), np.empty_like(x)
    fn(x.ctypes.data, whole.ctypes.data, x.size)
    for i in range(0, 64):
        fn(x[i:].ctypes.data, one_by_one[i:].ctypes.data, 1)
    np.testing.assert_array_equal(whole[:64].view(np.uint32), one_by_one[:64].view(np.uint32))


def test_special_values_match_interpreter():
    """inf, NaN and ±0 give what the reference interpreter gives (NaN at -inf for silu/gelu)."""
    from tilefold.ir import OPS

    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45], np.float32)
    mod = math_module(host_target(), host_target().vector_bits // 32)
    ops = {"gelu_tanh": ("gelu", {"approximate": "tanh"}), "gelu": ("gelu", {})}
    for name in WHOLE_LINE:
        op, attrs = ops.get(name, (name, {}))
        want = OPS[op].reference([specials], attrs)
        fn = mod.function(name, None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        got = np.empty_like(specials)
        fn(specials.ctypes.data, got.ctypes.data, specials.size)
        finite = np.isfinite(want) & (np.abs(want) > 1e-30)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)], err_msg=name)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, err_msg=name)


def test_exp_nonpositive_within_exps_bound_and_flushes_below_the_normals(compiled):
    """The softmax exp (x <= 0): exp's bound wherever e**x is normal, exactly 0 where it is
    subnormal (x < ln 2**-126) or x = -inf, NaN for NaN, in vectors and scalar tails."""
    from tilefold.codegen.llvm.vecmath.exp_log import EXP_FLUSH

    f = compiled.function("exp_nonpositive", None, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_int64)
    rng = np.random.default_rng(7)
    swept = sweep()
    edges = np.array([0.0, -0.0, -np.inf, np.nan, EXP_FLUSH, np.nextafter(EXP_FLUSH, 0),
                      -86.99, -87.0, -87.3, -88.0, -103.0, -1e30, -1e-45], np.float32)
    xs = np.concatenate([edges, -np.abs(swept), rng.uniform(-88, 0, 200_000)]).astype(np.float32)
    got = np.empty_like(xs)
    f(xs.ctypes.data, got.ctypes.data, xs.size - 3)  # the last 3 through the scalar tail too
    f(xs[-3:].ctypes.data, got[-3:].ctypes.data, 3)
    exact = reference("exp", xs)
    normal = exact >= 2.0**-126
    err = ulp_error(got[normal], exact[normal])
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUNDS["exp"], (xs[normal][worst], got[normal][worst], err[worst])
    flushed = ~normal & ~np.isnan(xs)
    assert (got[flushed] == 0).all() and (xs[flushed] < np.float32(EXP_FLUSH) + 1e-4).all()
    assert np.isnan(got[np.isnan(xs)]).all() and got[0] == got[1] == 1.0


def test_parts_evaluated_together_equal_one_vector_at_a_time():
    """`emit_math_parts` runs MATH_VECTORS vectors as one wide vector: bit for bit what each
    register-wide vector gives alone, for every function, 1, 2 and 4 parts."""
    from tilefold.codegen.llvm.vecmath import emit_math_parts

    target = host_target()
    lanes = target.vector_bits // 32
    mod = ir.Module("vecmath_parts_test")
    vty = ir.VectorType(F32, lanes)
    for name in MATH_FUNCTIONS:
        for parts in (1, 2, 4):
            for together in (False, True):
                fn = ir.Function(mod, ir.FunctionType(U.void, [F32.as_pointer()] * 2 + [U.i64]),
                                 f"{name}_{parts}_{together}")
                b = ir.IRBuilder(fn.append_basic_block())
                x, y, n = fn.args
                with U.for_range(b, U.const(0), n, lanes * parts) as i:
                    ptrs = [b.bitcast(b.gep(p, [b.add(i, U.const(k * lanes))]), vty.as_pointer())
                            for k in range(parts) for p in (x, y)]
                    vs = tuple(b.load(ptrs[2 * k], align=4) for k in range(parts))
                    out = (emit_math_parts(b, name, vs, target.features) if together else
                           tuple(emit_math(b, name, v, target.features) for v in vs))
                    for k, v in enumerate(out):
                        b.store(v, ptrs[2 * k + 1], align=4)
                b.ret_void()
    compiled = compile_llvm_ir(str(mod), target, name="vecmath_parts_test")
    x = sweep(seed=2)
    x = x[: x.size // (4 * lanes) * 4 * lanes]
    for name in MATH_FUNCTIONS:
        for parts in (1, 2, 4):
            got = {}
            for together in (False, True):
                fn = compiled.function(f"{name}_{parts}_{together}", None, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_int64)
                got[together] = np.empty_like(x)
                fn(x.ctypes.data, got[together].ctypes.data, x.size)
            np.testing.assert_array_equal(got[True].view(np.uint32), got[False].view(np.uint32),
                                          err_msg=f"{name}, {parts} parts")
