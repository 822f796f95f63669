"""Tensor types: a shape of static or named symbolic dims, an element dtype, optional strides,
and optionally how the tensor is laid out over a device mesh (`f32[8,16] @m[S(0),R]`)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tilefold.dtypes import DType
from tilefold.dtypes import dtype as to_dtype
from tilefold.errors import ShapeError
from tilefold.ir import dims
from tilefold.ir.dims import SYMBOL


@dataclass(frozen=True)
class SymDim:
    """A dimension known only by name until run time, e.g. `?batch`, or a polynomial of such
    dims, e.g. `?(past+1)`, `?(b*t)` (`ir/dims.py`)."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not (SYMBOL.fullmatch(self.name)
                                                  or dims.is_derived(self.name)):
            raise ShapeError(f"symbolic dim name {self.name!r} is not an identifier or a "
                             "polynomial of them in canonical form (e.g. s0+1, s0*s1)")

    @property
    def free(self) -> frozenset[str]:
        """The symbols whose sizes give this dim's."""
        return dims.free_symbols(self.name)

    def __str__(self) -> str:
        return f"?{self.name}" if SYMBOL.fullmatch(self.name) else f"?({self.name})"


Dim = int | SymDim


def dim(spec: int | str | SymDim) -> Dim:
    """Normalize a dim spec: `8` -> 8, `"batch"`, `"?batch"` -> SymDim("batch"), `"?(s+1)"` ->
    SymDim("s+1")."""
    if isinstance(spec, SymDim):
        return spec
    if isinstance(spec, str):
        name = spec.removeprefix("?")
        if name.startswith("(") and name.endswith(")"):
            name = name[1:-1]
        return SymDim(name)
    return int(spec)


def dim_sum(*parts: Dim) -> Dim:
    """The dim `a + b + ...`: an int when every part is, else the canonical sum."""
    terms: dict[str, int] = {}
    const = 0
    for d in parts:
        if isinstance(d, int):
            const += d
            continue
        t, c = dims.parse(d.name) or ({d.name: 1}, 0)
        const += c
        for s, k in t.items():
            terms[s] = terms.get(s, 0) + k
    terms = {s: k for s, k in terms.items() if k}
    if not terms:
        return const
    if const == 0 and len(terms) == 1 and next(iter(terms.values())) == 1:
        return SymDim(next(iter(terms)))
    return SymDim(dims.render(terms, const))


def bind_dim(d: Dim, sizes: dict[str, int]) -> Dim:
    """`d` with the symbols `sizes` names replaced by their sizes: an int once every symbol
    is, else the polynomial of the rest (`?(b*t+1)` with b = 8: `?(8*t+1)`)."""
    if not isinstance(d, SymDim):
        return d
    if not isinstance(sizes, dims.Bindings):
        sizes = dims.Bindings(sizes)
    if d.name in sizes or not dims.is_derived(d.name):
        return sizes.get(d.name, d)
    terms, const = dims.parse(d.name)  # type: ignore[misc]
    parts: list[Dim] = [const]
    for monomial, coefficient in terms.items():
        symbols = dims.symbols_of(monomial)
        rest = [s for s in symbols if s not in sizes]
        coefficient *= math.prod(sizes[s] for s in symbols if s in sizes)
        if not rest:
            parts.append(coefficient)
        elif coefficient:
            parts.append(SymDim(dims.render({"*".join(rest): coefficient}, 0)))
    return dim_sum(*parts)


@dataclass(frozen=True)
class TensorType:
    """The type of an SSA value: `f32[?batch,768]`, or with element strides `f32[4,8]{1,4}`.

    `strides` is None for the default (row-major, contiguous) layout.
    """

    shape: tuple[Dim, ...]
    dtype: DType
    strides: tuple[int, ...] | None = None
    sharding: Sharding | None = None

    def __post_init__(self) -> None:
        for d in self.shape:
            if not isinstance(d, SymDim) and (type(d) is not int or d < 0):
                raise ShapeError(f"bad dimension {d!r} in a tensor type: use an int >= 0 or ?name")
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise ShapeError(f"{len(self.strides)} strides given for a rank-{len(self.shape)} type")
        if self.sharding is not None and not isinstance(self.sharding, Sharding):
            raise ShapeError(f"a tensor type's sharding must be a Sharding, got {self.sharding!r}")

    @staticmethod
    def of(
        dtype: str | DType,
        shape: Sequence[int | str | SymDim] = (),
        strides: Sequence[int] | None = None,
    ) -> TensorType:
        return TensorType(
            tuple(dim(d) for d in shape),
            to_dtype(dtype),
            None if strides is None else tuple(int(s) for s in strides),
        )

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def symbols(self) -> set[str]:
        """The names of its symbolic dims (a sum's own name, not its symbols')."""
        return {d.name for d in self.shape if isinstance(d, SymDim)}

    @property
    def num_elements(self) -> int:
        """Element count of a static type."""
        assert self.is_static, f"{self} has symbolic dims"
        return math.prod(self.shape)  # type: ignore[arg-type]

    def with_shape(self, shape: Sequence[int | str | SymDim]) -> TensorType:
        return TensorType(tuple(dim(d) for d in shape), self.dtype)

    def with_dtype(self, dtype: str | DType) -> TensorType:
        return TensorType(self.shape, to_dtype(dtype), self.strides, self.sharding)

    def without_layout(self) -> TensorType:
        """The type without strides (its sharding, if any, stays)."""
        if self.strides is None:
            return self
        return TensorType(self.shape, self.dtype, None, self.sharding)

    def with_sharding(self, sharding: Sharding | None) -> TensorType:
        return TensorType(self.shape, self.dtype, self.strides, sharding)

    def without_sharding(self) -> TensorType:
        return self if self.sharding is None else self.with_sharding(None)

    def bind(self, bindings: dict[str, int]) -> TensorType:
        """Replace the symbols `bindings` names with their sizes (`bind_dim`)."""
        if not isinstance(bindings, dims.Bindings):
            bindings = dims.Bindings(bindings)
        shape = tuple(bind_dim(d, bindings) for d in self.shape)
        return TensorType(shape, self.dtype, self.strides, self.sharding)

    def __str__(self) -> str:
        text = f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
        if self.strides is not None:
            text += "{" + ",".join(str(s) for s in self.strides) + "}"
        if self.sharding is not None:
            text += f" {self.sharding}"
        return text


# -- meshes and placements ---------------------------------------------------------------------


@dataclass(frozen=True)
class Mesh:
    """A named grid of devices, `mesh @m [dp=2, tp=4]`: axes in order, the last varying fastest
    over rank numbers (rank = row-major index of its coordinates)."""

    name: str
    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not SYMBOL.fullmatch(self.name):
            raise ShapeError(f"mesh name @{self.name} is not an identifier")
        names = [a for a, _ in self.axes]
        for axis, size in self.axes:
            if not SYMBOL.fullmatch(axis):
                raise ShapeError(f"mesh @{self.name}: axis name {axis!r} is not an identifier")
            if type(size) is not int or size < 1:
                raise ShapeError(
                    f"mesh @{self.name}: axis {axis} has size {size!r}; use an int >= 1"
                )
        if len(set(names)) != len(names):
            raise ShapeError(f"mesh @{self.name} names an axis twice: {', '.join(names)}")

    @staticmethod
    def of(name: str, **axes: int) -> Mesh:
        return Mesh(name, tuple(axes.items()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        """How many devices (ranks) the mesh has."""
        return math.prod(self.sizes)

    def axis_index(self, axis: str) -> int:
        if axis not in self.names:
            raise ShapeError(
                f"{self.declaration()} has no axis {axis!r} (it has: {', '.join(self.names)})"
            )
        return self.names.index(axis)

    def declaration(self) -> str:
        """The module-level text that declares the mesh."""
        return f"mesh @{self.name} [{', '.join(f'{a}={s}' for a, s in self.axes)}]"


@dataclass(frozen=True)
class Replicate:
    """Every device on the mesh axis holds the whole tensor."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Shard:
    """The tensor's dim `dim` is split into equal contiguous blocks, one per device on the axis.

    With `pad` (`S(0,pad)`) the dim need not split evenly: each of the n devices holds
    ceil(size/n) rows, block k the rows [k*c, min((k+1)*c, size)) and then padding up to c rows,
    whose values are unspecified. An even split marked pad has no padding.
    """

    dim: int
    pad: bool = False

    def __str__(self) -> str:
        return f"S({self.dim},pad)" if self.pad else f"S({self.dim})"


PARTIAL_REDUCTIONS = ("sum", "max")


@dataclass(frozen=True)
class Partial:
    """Each device holds a partial value; the tensor is their `op` (sum or max) over the axis."""

    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in PARTIAL_REDUCTIONS:
            raise ShapeError(f"partial reduction {self.op!r}: use one of {PARTIAL_REDUCTIONS}")

    def __str__(self) -> str:
        return f"P({self.op})"


Placement = Replicate | Shard | Partial


@dataclass(frozen=True)
class Sharding:
    """A tensor's placement over a mesh: one placement per mesh axis, `@m[S(0),R]`."""

    mesh: Mesh
    placements: tuple[Placement, ...]

    def __str__(self) -> str:
        return f"@{self.mesh.name}{format_placements(self.placements)}"

    def replace(self, axis: int, placement: Placement) -> Sharding:
        placements = list(self.placements)
        placements[axis] = placement
        return Sharding(self.mesh, tuple(placements))


def format_placements(placements: Sequence[Placement]) -> str:
    return "[" + ",".join(map(str, placements)) + "]"


def parse_placement(text: str) -> Placement:
    """`R`, `S(1)`, `S(1,pad)`, `P(sum)` or `P(max)` as a placement (ShapeError for anything
    else)."""
    text = text.strip()
    if text == "R":
        return Replicate()
    m = re.fullmatch(r"S\(\s*(\d+)\s*(,\s*pad\s*)?\)", text)
    if m:
        return Shard(int(m.group(1)), m.group(2) is not None)
    m = re.fullmatch(r"P\(\s*(\w+)\s*\)", text)
    if m:
        return Partial(m.group(1))
    raise ShapeError(f"placement {text!r} is not R, S(dim), S(dim,pad) or P(sum|max)")


def parse_placements(text: str) -> tuple[Placement, ...]:
    """`[S(0),R]` (the text `format_placements` writes) as placements."""
    inner = text.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        raise ShapeError(f"placements {text!r} must be a bracketed list such as [S(0),R]")
    inner = inner[1:-1].strip()
    parts = re.split(r",(?![^(]*\))", inner)  # commas outside parentheses
    return tuple(parse_placement(p) for p in parts) if inner else ()


def sharding_problem(t: TensorType) -> str | None:
    """Why the placements of `t` do not fit its shape and mesh, or None when they do.

    One placement per mesh axis; `S(d)` needs `d < rank`; each static dim must split evenly over
    the axes that shard it (in mesh order) unless the shard is padded (`S(d,pad)`), which cuts
    it in blocks of ceil(size/n). Symbolic dims are checked when sizes are known.
    """
    sharding = t.sharding
    if sharding is None:
        return None
    mesh = sharding.mesh
    if len(sharding.placements) != len(mesh.axes):
        return (
            f"{len(sharding.placements)} placements for the {len(mesh.axes)} axes of "
            f"{mesh.declaration()}; give one per axis"
        )
    sizes = list(t.shape)
    for (axis, n), placement in zip(mesh.axes, sharding.placements, strict=True):
        if not isinstance(placement, Shard):
            continue
        d = placement.dim
        if d >= t.rank:
            return f"S({d}) on axis {axis} is out of range for a rank-{t.rank} tensor"
        size = sizes[d]
        if isinstance(size, SymDim):
            continue
        if size % n and not placement.pad:
            return (
                f"dim {d} ({size}{' per block' if size != t.shape[d] else ''}) does not split "
                f"evenly over axis {axis}={n} of {mesh.declaration()}; write S({d},pad) to "
                f"pad each block to {-(-size // n)} rows"
            )
        sizes[d] = -(-size // n)
    return None


def level_shape(t: TensorType, axis: int) -> tuple[Dim, ...]:
    """The shape of the blocks that mesh axis `axis` cuts: `t`'s shape with the shards of the
    earlier axes applied (padded ones rounded up to whole blocks of ceil(size/n))."""
    if t.sharding is None:
        return t.shape
    sizes = list(t.shape)
    for n, placement in zip(t.sharding.mesh.sizes[:axis], t.sharding.placements[:axis],
                            strict=True):
        if isinstance(placement, Shard) and isinstance(sizes[placement.dim], int):
            sizes[placement.dim] = -(-sizes[placement.dim] // n)  # type: ignore[operator]
    return tuple(sizes)


def local_shape(t: TensorType) -> tuple[Dim, ...]:
    """The shape each device holds of a sharded tensor (static dims divided by their axes,
    rounded up where a padded shard splits unevenly)."""
    return t.shape if t.sharding is None else level_shape(t, len(t.sharding.placements))


def pad_uneven(t: TensorType) -> TensorType:
    """`t` with each shard that does not split its dim evenly made a padded one (how a strategy
    asked to pad places an uneven split)."""
    if t.sharding is None:
        return t
    placements = list(t.sharding.placements)
    for axis, (n, p) in enumerate(zip(t.sharding.mesh.sizes, placements, strict=True)):
        if isinstance(p, Shard) and p.dim < t.rank:
            size = level_shape(t.with_sharding(Sharding(t.sharding.mesh, tuple(placements))),
                               axis)[p.dim]
            if isinstance(size, int) and size % n:
                placements[axis] = Shard(p.dim, True)
    return t.with_sharding(Sharding(t.sharding.mesh, tuple(placements)))
