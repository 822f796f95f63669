"""The reference interpreter: runs a module on NumPy arrays using each op's reference.

It defines what every op means; every compiled path is tested against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError
from tilefold.ir.core import Block, Function, Module, Value
from tilefold.ir.types import SymDim, TensorType


def bind_symbols(fn: Function, args: Sequence[np.ndarray]) -> dict[str, int]:
    """Check `args` against the function's parameter types; return the symbolic dim sizes."""
    if len(args) != len(fn.args):
        raise ShapeError(f"@{fn.name} takes {len(fn.args)} inputs, got {len(args)}")
    bindings: dict[str, int] = {}
    for param, arg in zip(fn.args, args):
        t = param.type
        where = f"@{fn.name} input %{param.name}"
        if dtypes.dtype(arg.dtype) != t.dtype:
            raise DTypeError(f"{where} expects {t}, got an array of {arg.dtype}")
        if arg.ndim != t.rank:
            raise ShapeError(f"{where} expects {t}, got shape {list(arg.shape)}")
        for d, size in zip(t.shape, arg.shape):
            if isinstance(d, SymDim):
                if bindings.setdefault(d.name, size) != size:
                    raise ShapeError(
                        f"{where}: ?{d.name} is {bindings[d.name]} elsewhere but {size} here"
                    )
            elif d != size:
                raise ShapeError(f"{where} expects {t}, got shape {list(arg.shape)}")
    return bindings


def _bind_attrs(attrs: dict, bindings: dict[str, int]) -> dict:
    return {
        k: tuple(bindings[d.name] if isinstance(d, SymDim) else d for d in v)
        if isinstance(v, tuple) and any(isinstance(d, SymDim) for d in v)
        else v
        for k, v in attrs.items()
    }


def _run_block(block: Block, env: dict[Value, np.ndarray], bindings: dict[str, int]):
    for op in block.ops:
        args = [env[v] for v in op.operands]
        if op.has_trait("terminator"):
            return args
        attrs = _bind_attrs(op.opdef.full_attrs(op.attrs), bindings)
        if op.regions:
            out = op.opdef.reference(args, attrs, lambda region, xs: run_region(region, xs))
        else:
            out = op.opdef.reference(args, attrs)
        outs = list(out) if isinstance(out, list | tuple) else [out]
        for result, value in zip(op.results, outs):
            env[result] = _check(np.asarray(value), result.type.bind(bindings), op.name)
    raise AssertionError("block without terminator")


def _check(value: np.ndarray, t: TensorType, op: str) -> np.ndarray:
    want_shape = tuple(d if isinstance(d, int) else -1 for d in t.shape)
    ok = value.ndim == t.rank and all(w in (-1, s) for w, s in zip(want_shape, value.shape))
    assert ok and value.dtype == t.dtype.np_dtype, f"{op} reference gave {value.shape} for {t}"
    return value


def run_region(region: Block, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate a region (e.g. a fused group's body) on arrays bound to its arguments."""
    env = dict(zip(region.args, args))
    return _run_block(region, env, {})


def interpret(
    module: Module | Function, *args: np.ndarray, function: str = "main"
) -> list[np.ndarray]:
    """Run `function` of `module` on `args`; returns the list of outputs."""
    fn = module if isinstance(module, Function) else module.functions.get(function)
    if fn is None:
        raise ShapeError(f"module has no function @{function}")
    arrays = [np.asarray(a) for a in args]
    bindings = bind_symbols(fn, arrays)
    env = dict(zip(fn.args, arrays))
    return _run_block(fn.body, env, bindings)
