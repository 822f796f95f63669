"""Random tensor programs as plain data, built twice: as a tilefold graph and in float64 NumPy.

A `Program` is a list of steps over numbered values (value 0.. are the inputs), so a failure
prints as a literal that can be pasted into the regression list. `reference()` evaluates it
with NumPy in float64, independently of tilefold's interpreter, and carries for every value a
bound on the absolute error a float32 evaluation may make (`Ref.err`): each op adds a few
float32 ulps of its own result's magnitude and passes on its inputs' errors, scaled by how
much the op can amplify them (a sum of L terms by L, a matmul by K times the other operand, a
norm by 1/sqrt(var + eps)). A wrong kernel misses by the size of the values, far above it.

A program whose values leave the range where such a bound means something (near float32's
overflow, or float16's for a cast through it) raises `IllConditioned`; the fuzzer skips it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tilefold import functional as F
from tilefold.ir import Builder, Module

EPS32 = float(np.finfo(np.float32).eps)
ULPS = 8.0  # per op: vector math is within a few ulps; reductions reassociate
# Unary ops and the largest slope each has on the inputs the programs feed them.
UNARY = {"neg": 1.0, "abs": 1.0, "relu": 1.0, "tanh": 1.0, "sigmoid": 0.25, "silu": 1.1,
         "gelu": 1.13, "exp_tanh": math.e, "sqrt_abs1": 0.5, "log_abs1": 1.0}
BINARY = ("add", "sub", "mul", "max", "min", "div_abs1")
REDUCE = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")
COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
POWERS = (2, 3, 4)
# A round trip through a narrower float: its unit roundoff, half its smallest subnormal, and
# the largest magnitude that does not round to infinity.
NARROW = {"f16": (2.0**-11, 2.0**-25, 65504.0), "bf16": (2.0**-8, 2.0**-134, 3.38e38)}
NORM_EPS = 1e-3
LARGEST = 1e30  # values beyond this risk float32 overflow somewhere downstream


class IllConditioned(Exception):
    """The program's values leave the range its error bounds are made for."""


@dataclass
class Program:
    """`inputs`: shapes of the arguments; `steps`: ops, each a tuple starting with its kind;
    `outputs`: the values returned; `seed`: where constant and input data come from;
    `layouts`: how each input is laid out in memory when passed (see the test's `_laid_out`)."""

    inputs: list[tuple[int, ...]]
    steps: list[tuple] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    seed: int = 0
    layouts: list[str] = field(default_factory=list)


@dataclass
class Ref:
    value: np.ndarray  # float64
    err: float  # bound on |float32 evaluation - value|


def _data(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.7).astype(np.float32)


def _mag(x: np.ndarray) -> float:
    return float(np.max(np.abs(x))) if x.size else 0.0


def inputs(program: Program) -> list[np.ndarray]:
    rng = np.random.default_rng(program.seed)
    return [_data(rng, s) for s in program.inputs]


def _constants(program: Program) -> np.random.Generator:
    return np.random.default_rng(program.seed + 1_000_003)


def _unary_np(name: str, x: np.ndarray) -> np.ndarray:
    if name == "gelu":
        from scipy.special import erf
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return {"neg": np.negative, "abs": np.abs, "relu": lambda v: np.maximum(v, 0.0),
            "tanh": np.tanh, "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
            "silu": lambda v: v / (1.0 + np.exp(-v)), "exp_tanh": lambda v: np.exp(np.tanh(v)),
            "sqrt_abs1": lambda v: np.sqrt(np.abs(v) + 1.0),
            "log_abs1": lambda v: np.log(np.abs(v) + 1.0)}[name](x)


def _unary_tf(name: str, x):
    if name == "exp_tanh":
        return F.exp(F.tanh(x))
    if name == "sqrt_abs1":
        return F.sqrt(F.abs(x) + 1.0)
    if name == "log_abs1":
        return F.log(F.abs(x) + 1.0)
    return getattr(F, name)(x)


def _binary_np(name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if name == "div_abs1":
        return x / (np.abs(y) + 1.0)
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
            "min": np.minimum}[name](x, y)


def _binary_tf(name: str, x, y):
    if name == "div_abs1":
        return x / (F.abs(y) + 1.0)
    return {"add": F.add, "sub": F.sub, "mul": F.mul, "max": F.maximum, "min": F.minimum}[name](
        x, y)


_COMPARE_TF = {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal"}


def _binary_err(name: str, a: Ref, b: Ref, out: np.ndarray) -> float:
    if name == "mul":
        return _mag(b.value) * a.err + _mag(a.value) * b.err + a.err * b.err
    if name == "div_abs1":  # |y| + 1 >= 1: x's error passes, y's is scaled by |x|
        return a.err + _mag(a.value) * b.err
    return a.err + b.err


def _norm_axes(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(range(axis % len(shape), len(shape)))


@dataclass
class Built:
    module: Module
    args: list[np.ndarray]  # the inputs, then the operands drawn as arguments
    refs: list[Ref]  # one per output


def build(program: Program) -> Built:
    """The tilefold module of `program`, its arguments and the float64 reference outputs."""
    b = Builder("main")
    rng = _constants(program)
    args = inputs(program)
    values = [b.arg(f"x{i}", "f32", s) for i, s in enumerate(program.inputs)]
    refs = [Ref(x.astype(np.float64), 0.0) for x in args]

    def operand(shape, as_const):
        """A new operand of `shape`: a constant, or one more argument of the function."""
        data = _data(rng, shape)
        if as_const:
            return b.constant(data), Ref(data.astype(np.float64), 0.0)
        args.append(data)
        return b.arg(f"x{len(args) - 1}", "f32", shape), Ref(data.astype(np.float64), 0.0)

    for step in program.steps:
        kind, src = step[0], step[1]
        x, rx = values[src], refs[src]
        if kind == "combine":  # a binary op between two values of the program
            name, other, swap = step[2], step[3], step[4]
            lhs, rhs, rl, rr = ((values[other], x, refs[other], rx) if swap
                                else (x, values[other], rx, refs[other]))
            out = _binary_np(name, rl.value, rr.value)
            y = _binary_tf(name, lhs, rhs)
            err = _binary_err(name, rl, rr, out) + ULPS * EPS32 * _mag(out)
        elif kind == "where":  # where(x <cmp> t, x, u): t and u new operands of one shape
            cmp, shape, as_const = step[2], tuple(step[3]), step[4]
            t, rt = operand(shape, as_const)
            u, ru = operand(shape, as_const)
            mask = COMPARE[cmp](rx.value, rt.value)
            out = np.where(mask, rx.value, ru.value)
            y = F.where(getattr(F, _COMPARE_TF[cmp])(x, t), x, u)
            # x's error may flip the mask where x is that close to t: there u stands for x
            close = np.abs(rx.value - rt.value) <= 4 * rx.err
            err = rx.err + _mag(np.where(close, rx.value - ru.value, 0.0))
        elif kind == "pow":
            e = step[2]
            out = rx.value ** e
            y = F.power(x, float(e))
            err = e * (_mag(rx.value) + rx.err) ** (e - 1) * rx.err + ULPS * EPS32 * _mag(out)
        elif kind == "cast":  # f32 -> f16/bf16 -> f32: the narrow format's rounding
            unit, tiny, largest = NARROW[step[2]]
            if _mag(rx.value) + 4 * rx.err >= largest:
                raise IllConditioned(f"{_mag(rx.value):.3g} overflows {step[2]}")
            out = rx.value
            y = F.cast(F.cast(x, step[2]), "f32")
            err = rx.err + unit * (_mag(out) + rx.err) + tiny
        elif kind == "concat":
            shape, axis, as_const, swap = tuple(step[2]), step[3], step[4], step[5]
            t, rt = operand(shape, as_const)
            pair, rpair = ((t, x), (rt, rx)) if swap else ((x, t), (rx, rt))
            out = np.concatenate([r.value for r in rpair], axis)
            y, err = F.concat(pair, axis), rx.err
        elif kind == "unary":
            name = step[2]
            out = _unary_np(name, rx.value)
            y, err = _unary_tf(name, x), UNARY[name] * rx.err + ULPS * EPS32 * _mag(out)
        elif kind in ("binary", "matmul"):
            shape, as_const, swap = step[3], step[4], step[5]
            t, ro = operand(tuple(shape), as_const)
            if kind == "matmul":
                lhs, rhs, rl, rr = (t, x, ro, rx) if swap else (x, t, rx, ro)
                out = np.matmul(rl.value, rr.value)
                k = rl.value.shape[-1]
                scale = _mag(np.matmul(np.abs(rl.value), np.abs(rr.value))) if out.size else 0
                y = lhs @ rhs
                err = (k * (_mag(rr.value) * rl.err + _mag(rl.value) * rr.err)
                       + ULPS * EPS32 * max(1, k) * scale)
            else:
                name = step[2]
                lhs, rhs, rl, rr = (t, x, ro, rx) if swap else (x, t, rx, ro)
                out = _binary_np(name, rl.value, rr.value)
                y = _binary_tf(name, lhs, rhs)
                err = _binary_err(name, rl, rr, out) + ULPS * EPS32 * _mag(out)
        elif kind == "reduce":
            name, axes, keepdims = step[2], step[3], step[4]
            fn = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max,
                  "reduce_min": np.min}[name]
            out = fn(rx.value, axis=axes, keepdims=keepdims)
            length = math.prod(rx.value.shape[a] for a in axes) if axes is not None \
                else rx.value.size
            y = getattr(F, {"reduce_sum": "sum", "reduce_mean": "mean", "reduce_max": "max",
                            "reduce_min": "min"}[name])(x, axes, keepdims)
            grow = length if name == "reduce_sum" else 1
            err = grow * rx.err + ULPS * EPS32 * max(1, length) * _mag(rx.value)
        elif kind in ("softmax", "log_softmax"):
            axis = step[2]
            shifted = rx.value - rx.value.max(axis=axis, keepdims=True)
            total = np.exp(shifted).sum(axis=axis, keepdims=True)
            out = np.exp(shifted) / total if kind == "softmax" else shifted - np.log(total)
            y = getattr(F, kind)(x, axis)
            length = rx.value.shape[axis]
            err = 2 * rx.err + ULPS * EPS32 * max(1, length) * max(1.0, _mag(out))
        elif kind in ("layer_norm", "rms_norm"):
            axis = step[2]
            axes = _norm_axes(rx.value.shape, axis)
            shape = rx.value.shape[axes[0]:]
            w = _data(rng, shape)
            xv = rx.value
            if kind == "layer_norm":
                bias = _data(rng, shape)
                xv = xv - xv.mean(axis=axes, keepdims=True)
                y = F.layer_norm(x, b.constant(w), b.constant(bias), eps=NORM_EPS, axis=axis)
            else:
                y = F.rms_norm(x, b.constant(w), eps=NORM_EPS, axis=axis)
            var = (xv * xv).mean(axis=axes, keepdims=True)
            out = xv / np.sqrt(var + NORM_EPS) * w
            if kind == "layer_norm":
                out = out + bias
            amp = 1.0 / math.sqrt(float(var.min()) + NORM_EPS) if var.size else 1.0
            length = math.prod(shape)
            err = (2 * amp * rx.err * _mag(w)
                   + ULPS * EPS32 * max(1, length) * amp * max(1.0, _mag(xv)) * _mag(w)
                   + ULPS * EPS32 * max(1.0, _mag(out)))
        elif kind == "transpose":
            perm = step[2]
            out, y, err = np.transpose(rx.value, perm), F.transpose(x, perm), rx.err
        elif kind == "reshape":
            shape = step[2]
            out, y, err = rx.value.reshape(shape), F.reshape(x, shape), rx.err
        elif kind == "slice":
            starts, stops, steps = step[2], step[3], step[4]
            index = tuple(slice(*s) for s in zip(starts, stops, steps, strict=True))
            out, err = rx.value[index], rx.err
            y = b.op("slice", x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
        elif kind == "expand_dims":
            out, y, err = np.expand_dims(rx.value, step[2]), F.expand_dims(x, step[2]), rx.err
        elif kind == "squeeze":
            out, y, err = np.squeeze(rx.value, step[2]), F.squeeze(x, step[2]), rx.err
        else:
            raise ValueError(f"unknown step kind {kind!r}")
        if _mag(np.asarray(out)) + 4 * err > LARGEST:
            raise IllConditioned(f"step {step} reaches {_mag(np.asarray(out)):.3g}")
        values.append(y)
        refs.append(Ref(np.asarray(out, np.float64), err))
    module = b.build(*[values[i] for i in program.outputs])
    return Built(module, args, [refs[i] for i in program.outputs])
