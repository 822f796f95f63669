"""Building IR from Python: a `Builder` appends ops to a function; `Tensor` overloads operators.

b = Builder("main")
x = b.arg("x", "f32", ("batch", 768))
w = b.constant(np.ones((768, 3072), np.float32))
module = b.build(F.gelu(x @ w))
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, Location, ShapeError, UnsupportedError, VerificationError
from tilefold.ir.core import NAME, Function, Module, Operation, Value
from tilefold.ir.opdef import OPS
from tilefold.ir.ops.common import int_range, round_to
from tilefold.ir.ops.shape import BEGIN, END
from tilefold.ir.types import Dim, SymDim, TensorType
from tilefold.ir.verifier import verify


class Tensor:
    """A value under construction; arithmetic on it appends ops to its builder."""

    __array_ufunc__ = None  # make `ndarray + Tensor` call Tensor.__radd__

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

    def __rpow__(self, o):
        return self._bin("pow", o, True)

    def __and__(self, o):
        return self._bin("and", o)

    def __rand__(self, o):
        return self._bin("and", o, True)

    def __or__(self, o):
        return self._bin("or", o)

    def __ror__(self, o):
        return self._bin("or", o, True)

    def __matmul__(self, o):
        return self._bin("matmul", o)

    def __rmatmul__(self, o):
        return self._bin("matmul", o, True)

    def __neg__(self):
        return self.builder.op("neg", self)

    def __abs__(self):
        return self.builder.op("abs", self)

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

    def __iter__(self):
        """The slices along a static first axis, so that `a, b = x` works as in NumPy."""
        size = self.shape[0] if self.ndim else None
        if not isinstance(size, int):
            raise UnsupportedError(f"cannot iterate over {self.type}: needs a static first axis")
        return (self[i] for i in range(size))

    def __bool__(self) -> bool:
        raise UnsupportedError(
            f"the truth value of {self!r} is unknown while building; use where() or compare "
            "into a bool tensor"
        )

    def reshape(self, *shape) -> Tensor:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], list | tuple) else shape
        return self.builder.op("reshape", self, shape=tuple(shape))

    def astype(self, dtype: str | dtypes.DType | np.dtype | type) -> Tensor:
        return self.builder.op("cast", self, dtype=dtypes.dtype(dtype))

    def __repr__(self) -> str:
        return f"Tensor(%{self.value.name}: {self.type})"


class Builder:
    """Appends ops to one function of a module, inferring result types and naming results.

    `loc` (a `Location`), when set, is attached to every op appended after it.
    """

    def __init__(self, name: str = "main", module: Module | None = None):
        _check_name("function", name)
        self.module = module or Module()
        if name in self.module.functions:
            raise VerificationError(f"the module already has a function @{name}")
        self.function = Function(name, [], [])
        self.module.add(self.function)
        self.loc: Location | None = None
        self._counter = 0
        self._built = False

    def arg(
        self,
        name: str,
        dtype: str | dtypes.DType,
        shape: Sequence = (),
        strides: Sequence | None = None,
    ) -> Tensor:
        """Add a function parameter; string dims (`"batch"`) are symbolic, `strides` in elements."""
        _check_name("argument", name)
        if any(v.name == name for v in self.function.values()):
            raise VerificationError(f"value %{name} is already defined in @{self.function.name}")
        value = Value(TensorType.of(dtype, shape, strides), name, None, 0)
        self.function.body.add_arg(value)
        return Tensor(self, value)

    def constant(
        self, value: Any, dtype: str | dtypes.DType | np.dtype | type | None = None,
        copy: bool = True,
    ) -> Tensor:
        """A constant tensor. NumPy data keeps its dtype; Python floats become f32, ints i64.

        With `dtype`, the data is converted to it (floats rounded once to nearest even).
        `copy=False` keeps a C-contiguous array as it is (a frozen weight whose owner watches
        for changes), so the IR does not hold the model's weights a second time.
        """
        array = np.asarray(value)
        if dtype is not None:
            dt = dtypes.dtype(dtype)
            if dt.is_integer and array.dtype.kind in "iu" and array.size:
                lo, hi = int_range(dt)
                if array.min() < lo or array.max() > hi:
                    raise DTypeError(f"{value} does not fit in {dt} ({lo}..{hi}); widen the dtype")
            array = round_to(array, dt)
        elif not isinstance(value, np.ndarray | np.generic) and array.dtype == np.float64:
            array = array.astype(np.float32)
        return self.op("constant", value=np.array(array, order="C", copy=copy or None))

    def _name(self) -> str:
        taken = {v.name for v in self.function.args}
        while str(self._counter) in taken:
            self._counter += 1
        self._counter += 1
        return str(self._counter - 1)

    def op(self, name: str, *operands: Any, **attrs: Any) -> Any:
        """Append op `name`; returns a Tensor, or a list of them for several results."""
        if self._built:
            raise VerificationError(f"@{self.function.name} is already built; start a new Builder")
        opdef = OPS.get(name)
        if opdef is None:
            raise UnsupportedError(f"unknown op '{name}'")
        values = [self.tensor(x).value for x in operands]
        norm = opdef.check_signature(len(values), attrs)
        types = opdef.infer_op([v.type for v in values], opdef.full_attrs(norm), [])
        op = Operation(opdef, values, norm, types, [self._name() for _ in types], loc=self.loc)
        self.function.body.append(op)
        results = [Tensor(self, r) for r in op.results]
        return results[0] if len(results) == 1 else results

    def tensor(self, x: Any) -> Tensor:
        """`x` as a Tensor of this builder: Tensors pass through, data becomes a constant."""
        if isinstance(x, Tensor):
            if x.builder is not self:
                raise VerificationError(
                    f"{x!r} belongs to another builder; build one function at a time"
                )
            return x
        return self.constant(x)

    def promote(self, a: Any, b: Any) -> tuple[Tensor, Tensor]:
        """Operands of a binary op, as PyTorch types them: a Python scalar adapts to the tensor
        (`x_bf16 * 2.0` stays bf16) unless it is of a higher kind; tensors promote, cast once."""
        if not isinstance(a, Tensor) and not isinstance(b, Tensor):
            a = self.tensor(a)
        if _is_scalar(a):
            a = self.constant(a, _weak_dtype(a, b.dtype))
        if _is_scalar(b):
            b = self.constant(b, _weak_dtype(b, a.dtype))
        a, b = self.tensor(a), self.tensor(b)
        target = dtypes.promote(a.dtype, b.dtype)
        return (
            a if a.dtype == target else a.astype(target),
            b if b.dtype == target else b.astype(target),
        )

    def index(self, x: Tensor, index: Any) -> Tensor:
        """NumPy basic indexing: ints, slices, None and `...` become slice/squeeze/expand_dims."""
        items = list(index) if isinstance(index, tuple) else [index]
        for item in items:
            if not (item is None or item is Ellipsis or isinstance(item, slice) or _is_int(item)):
                raise UnsupportedError(
                    f"index {item!r} is not supported: index with ints, slices, None and ..., "
                    "or use gather to select by an index tensor"
                )
        if items.count(Ellipsis) > 1:
            raise ShapeError("an index can hold only one '...'")
        used = sum(item is not None and item is not Ellipsis for item in items)
        if used > x.ndim:
            raise ShapeError(f"too many indices ({used}) for {x.type}")
        at = items.index(Ellipsis) if Ellipsis in items else len(items)
        items[at : at + 1] = [slice(None)] * (x.ndim - used)
        starts, stops, steps, squeeze, expand = [], [], [], [], []
        axis = 0
        for item in items:
            if item is None:
                expand.append(len(steps) - len(squeeze) + len(expand))
                continue
            if isinstance(item, slice):
                step = 1 if item.step is None else operator.index(item.step)
                default = (0, END) if step > 0 else (-1, BEGIN)
                starts.append(default[0] if item.start is None else operator.index(item.start))
                stops.append(default[1] if item.stop is None else operator.index(item.stop))
                steps.append(step)
            else:
                start = _static_index(operator.index(item), x.shape[axis], axis, x.type)
                starts.append(start)
                stops.append(start + 1)
                steps.append(1)
                squeeze.append(axis)
            axis += 1
        y = x
        if any((a, b, c) != (0, END, 1) for a, b, c in zip(starts, stops, steps, strict=True)):
            y = self.op("slice", x, starts=starts, stops=stops, steps=steps)
        if squeeze:
            y = self.op("squeeze", y, axes=squeeze)
        if expand:
            y = self.op("expand_dims", y, axes=expand)
        return y

    def build(self, *outputs: Any) -> Module:
        """Finish the function with `return(outputs)`, verify the module and return it."""
        values = [self.tensor(o).value for o in outputs]
        ret = Operation(OPS["return"], values, {}, [], [], loc=self.loc)
        self.function.body.append(ret)
        self.function.result_types = [v.type for v in values]
        self._built = True
        return verify(self.module)


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise VerificationError(f"{what} name {name!r} is not valid: use letters, digits, _.$-")


def _is_int(x: Any) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool | np.bool_)


def _is_scalar(x: Any) -> bool:
    """A Python scalar, typed weakly; NumPy scalars keep their dtype, as under NEP 50."""
    return isinstance(x, bool | int | float) and not isinstance(x, np.generic)


_KIND_ORDER = {"bool": 0, "uint": 1, "int": 1, "float": 2}


def _weak_dtype(scalar: bool | int | float, other: dtypes.DType) -> dtypes.DType:
    """A Python scalar's dtype next to a tensor of `other`: `other`, unless the scalar is of a
    higher kind (a float next to ints, an int next to bools), then f32 or i64."""
    kind = "bool" if isinstance(scalar, bool) else "int" if isinstance(scalar, int) else "float"
    if _KIND_ORDER[kind] <= _KIND_ORDER[other.kind]:
        return other
    return dtypes.f32 if kind == "float" else dtypes.i64


def _static_index(i: int, size: Dim, axis: int, t: TensorType) -> int:
    """An integer index, checked against a static axis; negative ones count from the end."""
    if isinstance(size, SymDim):
        raise ShapeError(f"cannot index symbolic dim {size} of {t} with an integer; use gather")
    if not -size <= i < size:
        raise ShapeError(f"index {i} is out of range for axis {axis} of {t}")
    return i + size if i < 0 else i


def trace(fn: Callable[..., Any], *params: tuple, name: str = "main") -> Module:
    """Build a module by calling `fn` on symbolic inputs.

    Each param is `(name, dtype, shape)`, e.g. `trace(f, ("x", "f32", ("batch", 16)))`.
    """
    b = Builder(name)
    out = fn(*(b.arg(*p) for p in params))
    return b.build(*(out if isinstance(out, tuple | list) else (out,)))
