"""Lowering rules for elementwise ATen ops: math, arithmetic, comparisons, where, casts."""

from __future__ import annotations

from typing import Any

import torch

from tilefold import dtypes
from tilefold.frontend.context import LoweringContext
from tilefold.frontend.lowering import NotApplicable, lowering

aten = torch.ops.aten

UNARY = {  # ATen overload -> tilefold op, same dtype in and out
    aten.exp.default: "exp",
    aten.log.default: "log",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.reciprocal.default: "reciprocal",
    aten.tanh.default: "tanh",
    aten.erf.default: "erf",
    aten.sigmoid.default: "sigmoid",
    aten.relu.default: "relu",
    aten.silu.default: "silu",
    aten.sin.default: "sin",
    aten.cos.default: "cos",
    aten.neg.default: "neg",
    aten.abs.default: "abs",
    aten.floor.default: "floor",
}

ARITHMETIC = {  # ATen overload -> tilefold op; operands cast to the result dtype first
    aten.add.Tensor: "add",
    aten.add.Scalar: "add",
    aten.sub.Tensor: "sub",
    aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul",
    aten.mul.Scalar: "mul",
    aten.div.Tensor: "div",
    aten.div.Scalar: "div",
    aten.true_divide.Tensor: "div",
    aten.pow.Tensor_Scalar: "pow",
    aten.pow.Tensor_Tensor: "pow",
    aten.pow.Scalar: "pow",
    aten.maximum.default: "max",
    aten.minimum.default: "min",
    aten.bitwise_and.Tensor: "and",
    aten.logical_and.default: "and",
    aten.bitwise_or.Tensor: "or",
    aten.logical_or.default: "or",
}

COMPARISON = {  # ATen overload -> tilefold op; operands cast to their promoted dtype, bool out
    aten.eq.Tensor: "eq",
    aten.eq.Scalar: "eq",
    aten.ne.Tensor: "ne",
    aten.ne.Scalar: "ne",
    aten.lt.Tensor: "lt",
    aten.lt.Scalar: "lt",
    aten.le.Tensor: "le",
    aten.le.Scalar: "le",
    aten.gt.Tensor: "gt",
    aten.gt.Scalar: "gt",
    aten.ge.Tensor: "ge",
    aten.ge.Scalar: "ge",
}

IDENTITY = (  # no data change in a value-semantics IR
    aten.clone.default,
    aten.alias.default,
    aten.contiguous.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
)


def _unary(name: str):
    def rule(ctx: LoweringContext, x: Any) -> Any:
        return ctx.elementwise(lambda t: ctx.op(name, t), [x], ctx.out_dtype())

    rule.__doc__ = f"elementwise {name}"
    return rule


def _arithmetic(name: str):
    def rule(ctx: LoweringContext, x: Any, y: Any, *, alpha: Any = 1) -> Any:
        dtype = ctx.out_dtype()
        if alpha == 1:  # else a number, or a SymInt (dynamic=True) read at run time
            return ctx.elementwise(lambda a, b: ctx.op(name, a, b), [x, y], dtype)
        if name not in ("add", "sub"):
            raise NotApplicable(f"alpha={alpha} on {name}")
        return ctx.elementwise(  # x + alpha * y
            lambda a, b, c: ctx.op(name, a, ctx.op("mul", b, c)), [x, y, alpha], dtype
        )

    rule.__doc__ = f"elementwise {name}"
    return rule


def _comparison(name: str):
    def rule(ctx: LoweringContext, x: Any, y: Any) -> Any:
        return ctx.elementwise(lambda a, b: ctx.op(name, a, b), [x, y], promoted(ctx, x, y))

    rule.__doc__ = f"comparison {name}"
    return rule


def promoted(ctx: LoweringContext, x: Any, y: Any) -> dtypes.DType:
    """PyTorch's type promotion of a tensor with a tensor or a Python number."""
    a, b = (ctx.meta(v) if isinstance(v, torch.fx.Node) else v for v in (x, y))
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        raise NotApplicable("an op on two Python numbers")
    return ctx.dtype(torch.result_type(a, b) if isinstance(a, torch.Tensor)
                     else torch.result_type(b, a))


for _target, _name in UNARY.items():
    lowering(_target)(_unary(_name))
for _target, _name in ARITHMETIC.items():
    lowering(_target)(_arithmetic(_name))
for _target, _name in COMPARISON.items():
    lowering(_target)(_comparison(_name))


@lowering(aten.softplus.default, whole=True)
def softplus(ctx: LoweringContext, x: Any, beta: Any = 1, threshold: Any = 20) -> Any:
    """log(1 + e**(beta x)) / beta, linear above the threshold"""
    attrs = {"beta": float(ctx.number(beta)), "threshold": float(ctx.number(threshold))}
    return ctx.elementwise(lambda t: ctx.op("softplus", t, **attrs), [x], ctx.out_dtype())


@lowering(aten.sign.default)
def sign(ctx: LoweringContext, x: Any) -> Any:
    """1 where x > 0, -1 where x < 0, else x itself (a zero, or NaN as PyTorch's)"""
    dt = ctx.out_dtype()
    if dt == dtypes.boolean:
        return ctx.value(x)

    def apply(t: Any) -> Any:
        zero = ctx.scalar(0, dt)
        negative = ctx.op("where", ctx.op("lt", t, zero), ctx.scalar(-1, dt), t)
        return ctx.op("where", ctx.op("gt", t, zero), ctx.scalar(1, dt), negative)

    return ctx.elementwise(apply, [x], dt)


@lowering(aten.isnan.default)
def isnan(ctx: LoweringContext, x: Any) -> Any:
    """x != x (only NaN differs from itself; integers never)"""
    t = ctx.tensor(x)
    if not t.dtype.is_float:
        return ctx.op("broadcast_to", ctx.scalar(False, dtypes.boolean), shape=list(t.shape))
    return ctx.op("ne", t, t)


@lowering(aten.log1p.default)
def log1p(ctx: LoweringContext, x: Any) -> Any:
    """log(1 + x), accurate for small x: log(u) x / (u - 1) with u = 1 + x rounded (the
    rounding of u cancels; Goldberg's formula), x itself where u rounds to 1, u where u is
    infinite; bf16/f16 computed in f32 and rounded once, as PyTorch"""
    out = ctx.out_dtype()
    dt = dtypes.f32 if out in (dtypes.bf16, dtypes.f16) else out

    def apply(t: Any) -> Any:
        one = ctx.scalar(1, dt)
        u = ctx.op("add", t, one)
        scaled = ctx.op("div", ctx.op("mul", ctx.op("log", u), t), ctx.op("sub", u, one))
        exact = ctx.op("where", ctx.op("eq", u, ctx.scalar(float("inf"), dt)), u, scaled)
        return ctx.cast(ctx.op("where", ctx.op("eq", u, one), t, exact), out)

    return ctx.elementwise(apply, [x], dt)


@lowering(*IDENTITY)
def identity(ctx: LoweringContext, x: Any, *args: Any, **kwargs: Any) -> Any:
    """A copy or alias: the same value (the IR has value semantics)."""
    return ctx.value(x)


@lowering(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default,
          torch.ops.prims.convert_element_type.default)
def to_dtype(ctx: LoweringContext, x: Any, *args: Any, **kwargs: Any) -> Any:
    """A dtype conversion (devices and layouts do not exist in the IR)."""
    return ctx.elementwise(lambda t: t, [x], ctx.out_dtype())


@lowering(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def where(ctx: LoweringContext, cond: Any, x: Any, y: Any) -> Any:
    """cond ? x : y"""
    dt = ctx.out_dtype()
    return ctx.op("where", ctx.tensor(cond), ctx.operand(x, dt), ctx.operand(y, dt))


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx: LoweringContext, x: Any, mask: Any, value: Any) -> Any:
    """mask ? value : x"""
    dt = ctx.out_dtype()
    return ctx.op("where", ctx.tensor(mask), ctx.operand(value, dt), ctx.tensor(x))


@lowering(aten.logical_not.default, aten.bitwise_not.default)
def logical_not(ctx: LoweringContext, x: Any) -> Any:
    """not x, as x == 0 (false)"""
    t = ctx.tensor(x)
    if ctx.out_dtype() != dtypes.boolean:
        raise NotApplicable("bitwise not of integers")
    return ctx.op("eq", t, ctx.scalar(0, t.dtype))


@lowering(aten.gelu.default)
def gelu(ctx: LoweringContext, x: Any, approximate: str = "none") -> Any:
    """gelu, exact (erf) or tanh-approximated"""
    return ctx.elementwise(
        lambda t: ctx.op("gelu", t, approximate=approximate), [x], ctx.out_dtype()
    )


@lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor,
          aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp(ctx: LoweringContext, x: Any, min: Any = None, max: Any = None) -> Any:
    """min(max(x, lo), hi), so lo > hi gives hi as PyTorch; clamp_max's bound is its second arg"""
    lo, hi = min, max
    if ctx.node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, min
    bounds = [b for b in (lo, hi) if b is not None]

    def apply(t: Any, *given: Any) -> Any:
        rest = list(given)
        if lo is not None:
            t = ctx.op("max", t, rest.pop(0))
        if hi is not None:
            t = ctx.op("min", t, rest.pop(0))
        return t

    return ctx.elementwise(apply, [x, *bounds], ctx.out_dtype())


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx: LoweringContext, x: Any, y: Any, *, rounding_mode: str | None = None) -> Any:
    """division with rounding: trunc or floor"""
    dt = ctx.out_dtype()
    a, b = ctx.operand(x, dt), ctx.operand(y, dt)
    if dt.is_float and rounding_mode == "floor":
        return ctx.cast(_floored(ctx, a, b)[0], dt)
    if dt.is_float and rounding_mode == "trunc":
        return _truncated(ctx, a, b)
    q = ctx.op("div", a, b)
    if rounding_mode in (None, "trunc"):
        return q
    fix = _sign_fix(ctx, a, b, q)  # floor(a/b) = trunc(a/b) - 1 where the remainder's sign differs
    return ctx.op("where", fix, ctx.op("sub", q, ctx.scalar(1, dt)), q)


@lowering(aten.remainder.Scalar, aten.remainder.Tensor)
def remainder(ctx: LoweringContext, x: Any, y: Any) -> Any:
    """Python's modulo: a - floor(a / b) * b, with the sign of b"""
    dt = ctx.out_dtype()
    a, b = ctx.operand(x, dt), ctx.operand(y, dt)
    if dt.is_float:
        return ctx.cast(_floored(ctx, a, b)[1], dt)
    r = ctx.op("sub", a, ctx.op("mul", ctx.op("div", a, b), b))
    return ctx.op("where", _sign_fix(ctx, a, b, None, r), ctx.op("add", r, b), r)


def _floored(ctx: LoweringContext, a: Any, b: Any) -> tuple[Any, Any]:
    """floor(a / b) and a - floor(a / b) * b of floats, computed in f64.

    PyTorch floors the exact quotient (through fmod). A quotient rounded to the operands' own
    precision can land on the integer above it (bf16: 2.99 / 1 -> 3.0); in f64 the quotient of
    two f32 (or narrower) numbers neither rounds onto an integer nor underflows, except for an
    infinite b, which follows Python: -1 // inf = -1 and -1 % inf = inf.
    """
    a, b = ctx.cast(a, dtypes.f64), ctx.cast(b, dtypes.f64)
    zero, inf = ctx.scalar(0, dtypes.f64), ctx.scalar(float("inf"), dtypes.f64)
    q = ctx.op("floor", ctx.op("div", a, b))
    r = ctx.op("sub", a, ctx.op("mul", q, b))
    opposite = ctx.op("lt", ctx.op("mul", a, b), zero)  # signs differ, a != 0 (no underflow)
    finite_by_inf = ctx.op("and", ctx.op("eq", ctx.op("abs", b), inf),
                           ctx.op("lt", ctx.op("abs", a), inf))
    q = ctx.op("where", ctx.op("and", finite_by_inf, opposite), ctx.scalar(-1, dtypes.f64), q)
    r = ctx.op("where", finite_by_inf, ctx.op("where", opposite, b, a), r)
    return q, r


def _truncated(ctx: LoweringContext, a: Any, b: Any) -> Any:
    """trunc(a / b) of floats, the quotient rounded to their dtype first (as PyTorch, also for
    bf16 and f16)."""
    q = ctx.op("div", a, b)
    up = ctx.op("neg", ctx.op("floor", ctx.op("neg", q)))  # ceil
    return ctx.op("where", ctx.op("lt", q, ctx.scalar(0, q.dtype)), up, ctx.op("floor", q))


def _sign_fix(ctx: LoweringContext, a: Any, b: Any, q: Any, r: Any = None) -> Any:
    """Where truncating division differs from flooring: remainder != 0 with b's other sign."""
    zero = ctx.scalar(0, a.dtype)
    r = ctx.op("sub", a, ctx.op("mul", q, b)) if r is None else r
    signs = ctx.op("where", ctx.op("lt", r, zero), ctx.op("ge", b, zero), ctx.op("lt", b, zero))
    return ctx.op("and", ctx.op("ne", r, zero), signs)


@lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(ctx: LoweringContext, x: Any, y: Any, alpha: Any = 1) -> Any:
    """y - alpha * x"""
    dt = ctx.out_dtype()
    t = ctx.operand(x, dt)
    if alpha != 1:  # a number, or a SymInt (dynamic=True) read at run time
        t = ctx.op("mul", t, ctx.operand(alpha, dt))
    return ctx.op("sub", ctx.operand(y, dt), t)


@lowering(aten.dropout.default)
def dropout(ctx: LoweringContext, x: Any, p: float, train: bool) -> Any:
    """dropout: the identity at inference, else `native_dropout`'s output"""
    if not train or p == 0:
        return ctx.value(x)
    return native_dropout(ctx, x, p, train)[0]


@lowering(aten.native_dropout.default)
def native_dropout(ctx: LoweringContext, x: Any, p: float, train: bool | None) -> Any:
    """(output, kept mask) of dropout. Training: each element is kept where a uniform draw
    from the graph's seed (`random_uniform`, a new seed every call) is at least p, and scaled
    by 1/(1-p). Outside training or at p = 0 every element is kept as is; at p = 1 none is
    (zeros, as PyTorch returns)."""
    p = ctx.number(p)
    t = ctx.operand(x, ctx.out_dtype(0))
    shape = ctx.out_shape(0)
    if train is not False and 0 < p < 1:
        seed, stream = ctx.seed()
        drawn = ctx.op("random_uniform", seed, shape=shape, stream=stream)
        keep = ctx.op("ge", drawn, ctx.scalar(p, dtypes.f32))
        kept = ctx.op("mul", t, ctx.cast(keep, t.dtype))  # as PyTorch: x * mask * scale
        return [ctx.op("mul", kept, ctx.scalar(1 / (1 - p), t.dtype)), keep]
    keep = not train or p == 0
    mask = ctx.scalar(keep, ctx.out_dtype(1))
    mask = ctx.op("broadcast_to", mask, shape=shape) if shape else mask
    if keep:
        return [t, mask]
    zero = ctx.scalar(0, ctx.out_dtype(0))
    return [ctx.op("broadcast_to", zero, shape=shape) if shape else zero, mask]


@lowering(aten.rand.default)
def rand(ctx: LoweringContext, size: Any, **kwargs: Any) -> Any:
    """Uniform numbers in [0, 1), drawn from the graph's seed (f32, or f64 from them)"""
    return _draw(ctx)


@lowering(aten.rand_like.default)
def rand_like(ctx: LoweringContext, x: Any, **kwargs: Any) -> Any:
    """`rand` of x's shape"""
    return _draw(ctx)


def _draw(ctx: LoweringContext) -> Any:
    """The current node's result, uniform in [0, 1), as its own random site."""
    if ctx.out_dtype() not in (dtypes.f32, dtypes.f64):
        raise NotApplicable(f"rand of {ctx.out_dtype()} (a draw rounded to it may reach 1)")
    seed, stream = ctx.seed()
    drawn = ctx.op("random_uniform", seed, shape=ctx.out_shape(), stream=stream)
    return ctx.cast(drawn, ctx.out_dtype())


@lowering("prims.fma.default")  # registered with Inductor's prims, not at import
def fma(ctx: LoweringContext, a: Any, b: Any, c: Any) -> Any:
    """a * b + c (`lerp`'s decomposition, as the optimizers' moving averages use it), as a
    multiply then an add: rounded twice, the IR having no fused multiply-add op"""
    return ctx.elementwise(lambda x, y, z: ctx.op("add", ctx.op("mul", x, y), z), [a, b, c],
                           ctx.out_dtype())
