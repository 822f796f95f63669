"""Building IR from Python: a `Builder` appends ops to a function; `Tensor` overloads operators.

    b = Builder("main")
    x = b.arg("x", "f32", ("batch", 768))
    w = b.constant(np.ones((768, 3072), np.float32))
    module = b.build(F.gelu(x @ w))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import Location, TilefoldError, UnsupportedError
from tilefold.ir.core import Function, Module, Operation, Value
from tilefold.ir.opdef import OPS
from tilefold.ir.types import TensorType
from tilefold.ir.verifier import verify


class Tensor:
    """A value under construction; arithmetic on it appends ops to its builder."""

    __array_priority__ = 1000  # make `ndarray + Tensor` call Tensor.__radd__

    def __init__(self, builder: Builder, value: Value):
        self.builder = builder
        self.value = value

    @property
    def type(self) -> TensorType:
        return self.value.type

    @property
    def shape(self) -> tuple:
        return self.value.type.shape

    @property
    def dtype(self) -> dtypes.DType:
        return self.value.type.dtype

    @property
    def ndim(self) -> int:
        return self.value.type.rank

    @property
    def T(self) -> Tensor:
        return self.builder.op("transpose", self, perm=tuple(reversed(range(self.ndim))))

    def _bin(self, name: str, other: Any, reverse: bool = False) -> Tensor:
        a, b = self.builder.promote(self, other)
        return self.builder.op(name, *((b, a) if reverse else (a, b)))

    def __add__(self, o):
        return self._bin("add", o)

    def __radd__(self, o):
        return self._bin("add", o, True)

    def __sub__(self, o):
        return self._bin("sub", o)

    def __rsub__(self, o):
        return self._bin("sub", o, True)

    def __mul__(self, o):
        return self._bin("mul", o)

    def __rmul__(self, o):
        return self._bin("mul", o, True)

    def __truediv__(self, o):
        return self._bin("div", o)

    def __rtruediv__(self, o):
        return self._bin("div", o, True)

    def __pow__(self, o):
        return self._bin("pow", o)

    def __matmul__(self, o):
        return self._bin("matmul", o)

    def __rmatmul__(self, o):
        return self._bin("matmul", o, True)

    def __neg__(self):
        return self.builder.op("neg", self)

    def __lt__(self, o):
        return self._bin("lt", o)

    def __le__(self, o):
        return self._bin("le", o)

    def __gt__(self, o):
        return self._bin("gt", o)

    def __ge__(self, o):
        return self._bin("ge", o)

    def __getitem__(self, index) -> Tensor:
        return self.builder.index(self, index)

    def reshape(self, *shape) -> Tensor:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], list | tuple) else shape
        return self.builder.op("reshape", self, shape=tuple(shape))

    def astype(self, dtype) -> Tensor:
        return self.builder.op("cast", self, dtype=dtypes.dtype(dtype))

    def __repr__(self) -> str:
        return f"Tensor(%{self.value.name}: {self.type})"


class Builder:
    """Appends ops to one function of a module, inferring result types and naming results."""

    def __init__(self, name: str = "main", module: Module | None = None):
        self.module = module or Module()
        self.function = Function(name, [], [])
        self.module.add(self.function)
        self.loc: Location | None = None
        self._counter = 0

    def arg(self, name: str, dtype, shape: Sequence = ()) -> Tensor:
        """Add a function parameter; string dims (`"batch"`) are symbolic."""
        value = Value(TensorType.of(dtype, shape), name, None, 0)
        if any(v.name == name for v in self.function.args):
            raise TilefoldError(f"argument %{name} is declared twice")
        self.function.body.add_arg(value)
        return Tensor(self, value)

    def constant(self, value: Any, dtype=None) -> Tensor:
        array = np.asarray(value)
        if dtype is not None:
            array = array.astype(dtypes.dtype(dtype).np_dtype)
        elif array.dtype == np.float64:
            array = array.astype(np.float32)  # Python floats are f32 unless asked otherwise
        elif array.dtype == np.int64 and array.ndim == 0:
            array = array.astype(np.int32)
        return self.op("constant", value=np.array(array, order="C"))

    def _name(self) -> str:
        while True:
            name = str(self._counter)
            self._counter += 1
            if all(v.name != name for v in self.function.args):
                return name

    def op(self, name: str, *operands: Tensor, **attrs: Any) -> Any:
        """Append op `name`; returns a Tensor, or a list of them for several results."""
        opdef = OPS.get(name)
        if opdef is None:
            raise UnsupportedError(f"unknown op '{name}'")
        values = [self.tensor(x).value for x in operands]
        try:
            norm = {k: opdef.attributes[k].normalize(v) for k, v in attrs.items()}
        except KeyError as exc:
            raise TilefoldError(f"'{name}' has no attribute {exc}") from None
        except TypeError as exc:
            raise TilefoldError(f"'{name}': {exc}") from None
        types = opdef.infer([v.type for v in values], opdef.full_attrs(norm))
        op = Operation(opdef, values, norm, types, [self._name() for _ in types], loc=self.loc)
        self.function.body.append(op)
        results = [Tensor(self, r) for r in op.results]
        return results[0] if len(results) == 1 else results

    def tensor(self, x: Any) -> Tensor:
        if isinstance(x, Tensor):
            if x.builder is not self:
                raise TilefoldError("a Tensor from another builder was used; build one graph")
            return x
        return self.constant(x)

    def promote(self, a: Any, b: Any) -> tuple[Tensor, Tensor]:
        """Operands of a binary op: Python scalars take the tensor's dtype; else PyTorch rules."""
        if not isinstance(a, Tensor):
            a = self.constant(np.asarray(a, dtype=self._scalar_dtype(a, b)))
        if not isinstance(b, Tensor):
            b = self.constant(np.asarray(b, dtype=self._scalar_dtype(b, a)))
        target = dtypes.promote(a.dtype, b.dtype)
        return (a if a.dtype == target else a.astype(target),
                b if b.dtype == target else b.astype(target))

    @staticmethod
    def _scalar_dtype(scalar: Any, other: Tensor) -> np.dtype:
        if isinstance(scalar, float) and not other.dtype.is_float:
            return np.dtype(np.float32)
        if isinstance(scalar, int | float | bool):
            return other.dtype.np_dtype
        return np.asarray(scalar).dtype

    def index(self, x: Tensor, index) -> Tensor:
        """NumPy basic indexing: ints, slices, None and `...` become slice/squeeze/expand_dims."""
        index = index if isinstance(index, tuple) else (index,)
        if sum(i is Ellipsis for i in index) > 1:
            raise TilefoldError("an index can hold one '...'")
        explicit = sum(i is not None and i is not Ellipsis for i in index)
        if Ellipsis in index:
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (x.ndim - explicit) + index[at + 1:]
        used = sum(i is not None for i in index)
        if used > x.ndim:
            raise TilefoldError(f"too many indices for {x.type}")
        index = index + (slice(None),) * (x.ndim - used)
        starts, stops, steps, squeeze, expand = [], [], [], [], []
        axis = out_axis = 0
        for item in index:
            if item is None:
                expand.append(out_axis)
                out_axis += 1
                continue
            if isinstance(item, int):
                size = x.shape[axis]
                start = item if item >= 0 or not isinstance(size, int) else item + size
                starts.append(start)
                stops.append(start + 1)
                steps.append(1)
                squeeze.append(axis)
            elif isinstance(item, slice):
                step = 1 if item.step is None else item.step
                starts.append(item.start if item.start is not None else (0 if step > 0 else -1))
                end = 2**63 - 1 if step > 0 else -(2**63)
                stops.append(item.stop if item.stop is not None else end)
                steps.append(step)
                out_axis += 1
            else:
                raise UnsupportedError(f"index {item!r} is not supported; use gather")
            axis += 1
        y = x
        if (starts, stops, steps) != ([0] * x.ndim, [2**63 - 1] * x.ndim, [1] * x.ndim):
            y = self.op("slice", x, starts=starts, stops=stops, steps=steps)
        if squeeze:
            y = self.op("squeeze", y, axes=squeeze)
        if expand:
            y = self.op("expand_dims", y, axes=expand)
        return y

    def build(self, *outputs: Tensor) -> Module:
        """Finish the function with `return(outputs)`, verify the module and return it."""
        values = [self.tensor(o).value for o in outputs]
        ret = Operation(OPS["return"], values, {}, [], [], loc=self.loc)
        self.function.body.append(ret)
        self.function.result_types = [v.type for v in values]
        return verify(self.module)


def trace(fn: Callable[..., Any], *params: tuple, name: str = "main") -> Module:
    """Build a module by calling `fn` on symbolic inputs.

    Each param is `(name, dtype, shape)`, e.g. `trace(f, ("x", "f32", ("batch", 16)))`.
    """
    b = Builder(name)
    out = fn(*(b.arg(*p) for p in params))
    return b.build(*(out if isinstance(out, tuple | list) else (out,)))
