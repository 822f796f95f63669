"""The reference interpreter: runs a module on NumPy arrays using each op's reference.

It defines what every op means; every compiled path is tested against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError, TilefoldError
from tilefold.ir.core import Block, Function, Module, Value
from tilefold.ir.dims import Bindings
from tilefold.ir.types import SymDim, TensorType


def bind_symbols(fn: Function, args: Sequence[np.ndarray]) -> dict[str, int]:
    """Check `args` against the function's parameter types; return the symbolic dim sizes."""
    return _bind(fn.args, args, f"@{fn.name}")


def _bind(params: Sequence[Value], args: Sequence[np.ndarray], owner: str) -> dict[str, int]:
    if len(args) != len(params):
        raise ShapeError(f"{owner} takes {len(params)} inputs, got {len(args)}")
    bindings = Bindings()
    for param, arg in zip(params, args, strict=True):
        t = param.type
        where = f"{owner} input %{param.name}"
        try:
            given = dtypes.dtype(arg.dtype)
        except DTypeError:
            given = None
        if given != t.dtype:
            raise DTypeError(f"{where} expects {t}, got an array of {arg.dtype}; convert it first")
        if arg.ndim != t.rank:
            raise ShapeError(f"{where} expects {t}, got shape {list(arg.shape)}")
        for d, size in zip(t.shape, arg.shape, strict=True):
            if isinstance(d, SymDim):
                if bindings.bind(d.name, size) != size:
                    raise ShapeError(
                        f"{where}: ?{d.name} is {bindings[d.name]} elsewhere but {size} here"
                    )
            elif d != size:
                raise ShapeError(f"{where} expects {t}, got shape {list(arg.shape)}")
    bindings.check(f"{owner} inputs")
    return bindings


def _bind_attrs(attrs: dict, bindings: dict[str, int]) -> dict:
    """Attributes with symbolic dims (e.g. a reshape's target shape) replaced by their sizes."""

    def size(d):
        if not isinstance(d, SymDim):
            return d
        if d.name not in bindings:
            raise ShapeError(f"?{d.name} is not bound by any input; run verify() first")
        return bindings[d.name]

    return {
        k: tuple(map(size, v))
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
        out = op.opdef.reference_op(args, attrs, op.regions, run_region)
        outs = list(out) if isinstance(out, list | tuple) else [out]
        for result, value in zip(op.results, outs, strict=True):
            env[result] = _check(np.asarray(value), result.type.bind(bindings), op.name)
    raise AssertionError("block without terminator")


def _check(value: np.ndarray, t: TensorType, op: str) -> np.ndarray:
    """A reference result must have the result type: anything else is a bug in the op."""
    ok = value.ndim == t.rank and all(
        isinstance(d, SymDim) or d == s for d, s in zip(t.shape, value.shape, strict=False)
    )
    assert ok and value.dtype == t.dtype.np_dtype, f"{op} reference gave {value.shape} for {t}"
    return value


def run_region(region: Block, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate a region (e.g. a fused group's body) on arrays bound to its arguments; symbolic
    dims take their sizes from those arrays."""
    arrays = [np.asarray(a) for a in args]
    bindings = _bind(region.args, arrays, "region")
    return _run_block(region, dict(zip(region.args, arrays, strict=True)), bindings)


def interpret(
    module: Module | Function, *args: np.ndarray, function: str | None = None
) -> list[np.ndarray]:
    """Run a function on `args` and return its outputs.

    `function` defaults to @main, or to the module's only function.
    """
    if isinstance(module, Function):
        fn = module
    else:
        only = next(iter(module.functions)) if len(module.functions) == 1 else "main"
        fn = module.functions.get(function or only)
        if fn is None:
            known = ", ".join(f"@{name}" for name in module.functions) or "none"
            raise TilefoldError(f"module has no function @{function or only} (it has: {known})")
    arrays = [np.asarray(a) for a in args]
    bindings = bind_symbols(fn, arrays)
    env = dict(zip(fn.args, arrays, strict=True))
    return _run_block(fn.body, env, bindings)
