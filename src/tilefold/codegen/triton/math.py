"""The kernel IR's call primitives as Triton expressions, one line a primitive.

Each entry formats its operands (already named locals) into a Triton expression. The forms use
`tl` only (no libdevice, whose module path moves between Triton releases), round as the LLVM
backend does (IEEE division and square root: `div_rn`, `sqrt_rn`) and keep NaN semantics of
NumPy (max/min propagate NaN from either side; `!=` is unordered). A few primitives need a
helper `@triton.jit` function, emitted once into the source (`HELPERS`). A primitive missing
from `PRIMITIVE_FORMS` is one the backend refuses (`supports` names it).

Triton lowers f32 `tl.log`, `tl.sin`, `tl.cos` and `tl.erf` to libdevice's accurate functions on
NVIDIA GPUs, but `tl.exp` to `ex2.approx(x log2 e)`, whose relative error grows with |x| (some
80 ulp at x = 80): exp is `_tf_exp`, a Cody-Waite reduction to |r| <= ln 2 / 2 before the fast
exp2, scaled by 2**k built from its bits (checked under the interpreter, which runs NumPy's
exp2; its GPU error bound is still to be measured on a GPU). `exp_nonpositive` (softmax's
e^(x - max), x - max <= 0) is one exp2 of x log2(e): its result is at most 1, so the error the
product's rounding adds (|x log2 e| u relative) stays below u absolute, small beside the row
sum of at least 1 it is divided by.
"""

from __future__ import annotations

# name -> format string over operands {0}, {1}, {2}
PRIMITIVE_FORMS: dict[str, str] = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "div": "tl.div_rn({0}, {1})",
    "max": "_tf_max({0}, {1})",               # NaN from either side
    "min": "_tf_min({0}, {1})",
    "lt": "{0} < {1}",
    "le": "{0} <= {1}",
    "gt": "{0} > {1}",
    "ge": "{0} >= {1}",
    "eq": "{0} == {1}",
    "ne": "{0} != {1}",                       # unordered: NaN != NaN
    "and": "{0} & {1}",
    "or": "{0} | {1}",
    "select": "tl.where({0}, {1}, {2})",
    "neg": "-{0}",
    "abs": "tl.abs({0})",
    "sqrt": "tl.sqrt_rn({0})",
    "rsqrt": "tl.div_rn(1.0, tl.sqrt_rn({0}))",
    "reciprocal": "tl.div_rn(1.0, {0})",
    "relu": "tl.where({0} < 0.0, 0.0, {0})",  # NaN stays NaN
    "floor": "tl.floor({0})",
    "round_bf16": "_tf_round_bf16({0})",      # bit arithmetic: no bf16 in the interpreter
    "round_f16": "{0}.to(tl.float16).to(tl.float32)",
    "exp": "_tf_exp({0})",
    "exp_nonpositive": "tl.exp2({0} * 1.4426950408889634)",  # x <= 0: see the header
    "log": "tl.log({0})",
    "tanh": "_tf_tanh({0})",
    "erf": "tl.erf({0})",
    "sigmoid": "tl.div_rn(1.0, 1.0 + _tf_exp(-{0}))",
    "silu": "tl.div_rn({0}, 1.0 + _tf_exp(-{0}))",
    "gelu": "0.5 * {0} * (1.0 + tl.erf({0} * 0.7071067811865476))",
    "gelu_tanh": "0.5 * {0} * (1.0 + _tf_tanh(0.7978845608028654 * ({0} + 0.044715 * {0} * {0}"
                 " * {0})))",
    "sin": "tl.sin({0})",
    "cos": "tl.cos({0})",
}
# "pow" has no libdevice-free form accurate for every sign of the base yet: refused.

# helper name -> its @triton.jit source; emitted when a form names it.
# Generated code calls only Triton builtins and these helpers, never a `@triton.jit` function
# of Triton's own library (tl.sum, tl.cdiv, tl.zeros): those are interpreted only when Triton
# was imported under TRITON_INTERPRET=1, so calling them would tie the interpreter to that.
HELPERS: dict[str, str] = {
    "_tf_add": """\
@triton.jit
def _tf_add(a, b):
    return a + b
""",
    "_tf_exp": """\
@triton.jit
def _tf_exp(x):
    # e**x = 2**k e**r: k = round(x log2 e), r = x - k ln 2 with ln 2 in two parts (Cephes'
    # 0.693359375, exact times any k here, minus 2.12194440e-4), so the fast exp2 sees
    # |r log2 e| <= 1/2 and its error no longer grows with |x|
    # clamped to +-160 (NaN to 0) first: beyond, r stays large and the result inf or 0,
    # and an infinite x keeps a finite k (inf - inf would be NaN)
    k = tl.floor(x * 1.4426950408889634 + 0.5)
    k = tl.where(k > 160.0, 160.0, tl.where(k < -160.0, -160.0, k))
    k = tl.where(k != k, 0.0, k)
    r = x - k * 0.693359375 + k * 2.12194440e-4
    p = tl.exp2(r * 1.4426950408889634)
    # 2**k as two exact powers of two (k = 128 is finite times p < 1; -149 is subnormal)
    half = tl.floor(k * 0.5)
    lo = ((half.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    hi = (((k - half).to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return p * lo * hi
""",
    "_tf_max": """\
@triton.jit
def _tf_max(a, b):
    return tl.where((a > b) | (a != a), a, b)
""",
    "_tf_min": """\
@triton.jit
def _tf_min(a, b):
    return tl.where((a < b) | (a != a), a, b)
""",
    "_tf_round_bf16": """\
@triton.jit
def _tf_round_bf16(x):
    # round to nearest even on the bits; NaN kept as it is (the carry would make it inf)
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
""",
    "_tf_tanh": """\
@triton.jit
def _tf_tanh(x):
    # Cephes tanhf: an odd polynomial below 0.625, else 1 - 2 / (e**2|x| + 1)
    a = tl.abs(x)
    z = x * x
    p = (((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
         + 1.33314422036e-1) * z - 3.33332819422e-1
    small = x + x * z * p
    big = 1.0 - tl.div_rn(2.0, _tf_exp(2.0 * a) + 1.0)
    big = tl.where(x < 0.0, -big, big)
    return tl.where(a < 0.625, small, big)
""",
}


def helpers_used(forms: list[str]) -> list[str]:
    """The helper sources the given forms call, directly or through other helpers, in
    `HELPERS` order."""
    used: set[str] = set()
    texts = list(forms)
    while True:
        more = {name for name in HELPERS if name not in used
                and any(name + "(" in text for text in texts)}
        if not more:
            return [src for name, src in HELPERS.items() if name in used]
        used |= more
        texts = [HELPERS[name] for name in more]
