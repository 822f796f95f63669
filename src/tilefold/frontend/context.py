"""The explicit context a lowering rule works through: values, sizes, types, and the builder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy
import torch
import torch.fx as fx

from tilefold import dtypes
from tilefold.dtypes import DType
from tilefold.errors import TilefoldError
from tilefold.frontend.graph_io import value_argument
from tilefold.frontend.lowering import NotApplicable, Specialized
from tilefold.frontend.symbolic import Composite, Size, Sizes
from tilefold.frontend.tensors import to_dtype
from tilefold.ir import Builder, Tensor
from tilefold.ir.types import Dim, SymDim

# sympy's and PyTorch's own (torch.utils._sympy) size functions, by name
_SIZE_OPS = {"Add": "add", "Mul": "mul", "Max": "max", "Min": "min"}


@dataclass(frozen=True)
class Merged:
    """A tensor whose first `lead` dims PyTorch sees flattened into one symbolic size.

    `x.view(-1, K)` of a `[?b,?s,K]` tensor has the size `?b*?s`, which the IR cannot name; the
    converter keeps the unflattened tensor instead, and rules that only touch the trailing dims
    (matmul rows, elementwise with trailing broadcasting) work on it directly.
    """

    tensor: Tensor
    lead: int


@dataclass(frozen=True)
class Unavailable:
    """A value the IR does not compute (e.g. layer_norm's saved mean); using it is NotApplicable."""

    reason: str


class LoweringContext:
    """What a rule sees: the node being lowered, the values computed so far and the builder."""

    def __init__(self, builder: Builder, sizes: Sizes):
        self.b = builder
        self.sizes = sizes
        self.env: dict[fx.Node, Any] = {}
        self.node: fx.Node | None = None
        self.mutations: dict[fx.Node, Tensor] = {}  # graph input -> the value written back
        self.size_inputs: dict[str, int] = {}  # symbol of a SymInt input -> its placeholder
        self.value_args: dict[str, Tensor] = {}  # symbol -> its `i64[]` argument (graph_io)
        self._scalars: dict[tuple, Tensor] = {}
        self.seed_arg: Tensor | None = None  # the graph's random seed (`seed`), made on first use
        self.streams = 0  # random sites drawn from it so far

    # -- values ------------------------------------------------------------------------------

    def value(self, arg: Any) -> Any:
        """The lowered value of an FX argument (a node, a list of them, or a literal)."""
        if isinstance(arg, fx.Node):
            found = self.env[arg]
            if isinstance(found, Unavailable):
                raise NotApplicable(found.reason)
            return found
        if isinstance(arg, list | tuple):
            return type(arg)(self.value(a) for a in arg)
        return arg

    def tensor(self, arg: Any) -> Tensor:
        """The argument as an IR tensor; a flattened symbolic tensor cannot be one."""
        found = self.value(arg)
        if isinstance(found, Merged):
            shape = self.meta(arg).shape
            raise NotApplicable(f"the size {shape[0]} (a product of symbolic sizes) has no IR name")
        if isinstance(found, int | SymDim | Composite):  # a size used as a number: an i64
            return self.size_value(found)
        if not isinstance(found, Tensor):
            raise NotApplicable(f"expected a tensor, got {found!r}")
        return found

    def size_value(self, size: Size) -> Tensor:
        """A size as a 0-d i64 tensor (PyTorch's SymInt): its symbols read from the arguments'
        shapes (`dim_size`), combined by the sums, products, max and min of its expression."""
        return self._expr_value(self.sizes.expr(size))

    def _expr_value(self, expr: sympy.Expr) -> Tensor:
        key = ("size", str(expr))
        if key not in self._scalars:
            if expr.is_Integer:
                return self.scalar(int(expr), dtypes.i64)
            if expr.is_Symbol:
                value = self._symbol_value(self.sizes.names.get(expr.name, expr.name))
            elif expr.func.__name__ in _SIZE_OPS:
                parts = [self._expr_value(a) for a in expr.args]
                value = parts[0]
                for part in parts[1:]:
                    value = self.op(_SIZE_OPS[expr.func.__name__], value, part)
            else:
                raise NotApplicable(f"the size {expr} has no IR value")
            self._scalars[key] = value
        return self._scalars[key]

    def _symbol_value(self, symbol: str) -> Tensor:
        for arg in self.b.function.args:
            for axis, d in enumerate(arg.type.shape):
                if isinstance(d, SymDim) and d.name == symbol:
                    return self.op("dim_size", Tensor(self.b, arg), axis=axis)
        if symbol in self.size_inputs:  # a SymInt input no tensor's shape holds: its number
            if symbol not in self.value_args:
                self.value_args[symbol] = value_argument(self.b, symbol)
            return self.value_args[symbol]
        raise NotApplicable(f"no input's shape carries the size ?{symbol}")

    def seed(self) -> tuple[Tensor, int]:
        """The graph's seed, an `i64[]` argument the runner draws anew from PyTorch's generator
        on every call (`converter.SEED`), and a stream of its own for one random site."""
        if self.seed_arg is None:
            self.seed_arg = self.b.arg("seed", dtypes.i64, ())
        self.streams += 1
        return self.seed_arg, self.streams - 1

    def operand(self, arg: Any, dtype: DType) -> Tensor:
        """A tensor argument cast to `dtype`, or a Python number as a scalar constant of it."""
        if isinstance(arg, fx.Node):
            return self.cast(self.tensor(arg), dtype)
        if isinstance(arg, bool | int | float):
            return self.scalar(arg, dtype)
        raise NotApplicable(f"unsupported operand {arg!r}")

    def scalar(self, value: bool | int | float, dtype: DType) -> Tensor:
        """A 0-d constant (one per value and dtype in a graph)."""
        key = (type(value), value, dtype.name)
        if key not in self._scalars:
            if dtype.is_integer and not float(value).is_integer():
                raise NotApplicable(f"{value} is not an integer of {dtype}")
            self._scalars[key] = self.b.constant(np.asarray(value).astype(dtype.np_dtype))
        return self._scalars[key]

    def cast(self, t: Tensor, dtype: DType) -> Tensor:
        return t if t.dtype == dtype else self.op("cast", t, dtype=dtype)

    def op(self, name: str, *operands: Any, **attrs: Any) -> Any:
        """Append an IR op; a type error from the op (a case the rule missed) is NotApplicable."""
        try:
            return self.b.op(name, *operands, **attrs)
        except TilefoldError as exc:
            raise NotApplicable(f"{name}: {exc.message}") from None

    # -- sizes and types ---------------------------------------------------------------------

    def meta(self, arg: Any = None) -> Any:
        """The FakeTensor (or SymInt, or tuple) PyTorch recorded for a node (default: current)."""
        node = self.node if arg is None else arg
        if not isinstance(node, fx.Node) or "val" not in node.meta:
            raise NotApplicable(f"no shape information for {node}")
        return node.meta["val"]

    def out(self, index: int | None = None) -> torch.Tensor:
        val = self.meta()
        return val[index] if index is not None else val

    def out_dtype(self, index: int | None = None) -> DType:
        return self.dtype(self.out(index).dtype)

    @staticmethod
    def dtype(dt: torch.dtype) -> DType:
        try:
            return to_dtype(dt)
        except TilefoldError as exc:
            raise NotApplicable(exc.message) from None

    def out_shape(self, index: int | None = None) -> tuple[Dim, ...]:
        """The current node's result shape as IR dims (NotApplicable for a product of sizes)."""
        return self.dims(self.out(index).shape)

    def dims(self, shape: Any, specialize: bool = True) -> tuple[Dim, ...]:
        """IR dims of a PyTorch shape; a size no IR dim names (a product or a floor division
        of sizes) is specialized (`static`), or NotApplicable without `specialize`."""
        dims = tuple(self.size(d) for d in shape)
        for d in dims:
            if isinstance(d, Composite):
                if specialize:
                    self.static(d)
                raise NotApplicable(f"the size {d} (a product of symbolic sizes) has no IR name")
        return dims  # type: ignore[return-value]

    def static(self, *sizes: Any) -> None:
        """Fix the symbols of `sizes` (sizes, SymInts or nodes computing them) to this trace's
        values: raises `Specialized` (the conversion starts over) unless they are constants."""
        values = [self.meta(s) if isinstance(s, fx.Node) else s for s in sizes]
        if any([self.sizes.specialize(v) for v in values]):  # every one, before starting over
            raise Specialized(f"specialized {', '.join(map(str, values))}")

    def number(self, arg: Any) -> Any:
        """A scalar argument as a Python number. `torch.compile(dynamic=True)` hands Python ints
        in as SymInts; where a rule needs the number itself (an attribute, a branch) it is
        specialized (`static`), as Dynamo does for every int without dynamic=True."""
        value = self.meta(arg) if isinstance(arg, fx.Node) else arg
        if not isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            return value
        self.static(value)
        expr = self.sizes.expr(value)
        return bool(expr) if isinstance(value, torch.SymBool) else (
            float(expr) if isinstance(value, torch.SymFloat) else int(expr))

    def size(self, arg: Any) -> Size:
        """An int argument (literal, SymInt or a node computing one) as a size."""
        if isinstance(arg, fx.Node):
            arg = self.meta(arg)
        return self.sizes.size(arg)

    def rank(self, arg: Any) -> int:
        return self.meta(arg).dim()

    # -- ops over flattened tensors ----------------------------------------------------------

    def trailing(self, arg: Any, fn: Callable[[Tensor], Tensor], dims: int) -> Any:
        """`fn` of the argument, for an op touching only its last `dims` dims (negative axes,
        trailing weights): a `Merged` argument is worked on unflattened and stays merged."""
        found = self.value(arg)
        if not isinstance(found, Merged):
            return fn(self.tensor(arg))
        if dims >= self.rank(arg):
            raise NotApplicable(f"{self.node.target} over a merged symbolic dim")
        return Merged(fn(found.tensor), found.lead)

    def elementwise(self, fn: Any, args: list[Any], dtype: DType) -> Any:
        """Apply `fn(*tensors)` to the arguments cast to `dtype` (numbers become scalars).

        When an argument is `Merged`, the others must broadcast over its trailing dims only (a
        bias, a scalar) or be merged the same way; the result is then merged too.
        """
        values = [self.value(a) if isinstance(a, fx.Node) else a for a in args]
        merged = [v for v in values if isinstance(v, Merged)]
        if not merged:
            return fn(*(self.operand(a, dtype) for a in args))
        first = merged[0]
        lead_shape = first.tensor.shape[: first.lead]
        logical_rank = first.tensor.ndim - first.lead + 1
        tensors = []
        for arg, v in zip(args, values, strict=True):
            if isinstance(v, Merged):
                same_lead = v.lead == first.lead and all(
                    self.sizes.same(a, c)
                    for a, c in zip(v.tensor.shape[: v.lead], lead_shape, strict=True)
                )
                if not same_lead:
                    raise NotApplicable("operands are flattened from different shapes")
                tensors.append(self.cast(v.tensor, dtype))
            elif isinstance(arg, fx.Node) and self.rank(arg) >= logical_rank:
                raise NotApplicable("an operand broadcasts over a flattened symbolic dim")
            else:
                tensors.append(self.operand(arg, dtype))
        return Merged(fn(*tensors), first.lead)
