"""The command line's program inputs for `run`, `explain` and `tune`: the IR file's function,
`--bind` sizes and `.npy` arrays, each checked so that bad input is an error saying what to do."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from tilefold import dtypes
from tilefold.errors import DTypeError, ShapeError, TilefoldError
from tilefold.ir import Function, Module, SymDim, Value, parse_file, verify
from tilefold.passes.pipeline import key_values


def count(minimum: int):
    """An argparse type: an integer of at least `minimum` (a usage error otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse


def load_function(path: str, function: str,
                  resource_dir: str | Path | None = None) -> tuple[Module, Function]:
    """The verified module in the IR file at `path` and its function `function`. Side-file
    constants are looked up in `resource_dir`, by default the file's directory."""
    module = verify(parse_file(path, Path(path).parent if resource_dir is None else resource_dir))
    fn = module.functions.get(function)
    if fn is None:
        known = ", ".join(f"@{name}" for name in module.functions) or "none"
        raise TilefoldError(f"{path} has no function @{function} (it has: {known}); "
                            "choose one with --function NAME")
    return module, fn


def parse_pairs(items: list[str], flag: str, sigil: str) -> dict[str, str]:
    """`NAME=VALUE` texts (NAME may start with `sigil`) as a dict; each name at most once."""
    return key_values(
        items, lambda item: TilefoldError(f"{flag} expects NAME=VALUE, got {item!r}"),
        lambda name, old, new: TilefoldError(f"{flag} gives {sigil}{name} twice ({old} and "
                                             f"{new})"), prefix=sigil)


def symbolic_dims(fn: Function) -> list[str]:
    """The names of the symbolic dims in `fn`'s argument types, in order of appearance."""
    names = [d.name for a in fn.args for d in a.type.shape if isinstance(d, SymDim)]
    return list(dict.fromkeys(names))


def parse_bindings(items: list[str], fn: Function) -> dict[str, int]:
    """`--bind DIM=SIZE` texts as sizes of `fn`'s symbolic dims (names checked, sizes >= 0)."""
    dims = symbolic_dims(fn)
    bindings = {}
    for name, text in parse_pairs(items, "--bind", "?").items():
        if name not in dims:
            has = (f"its dims are {', '.join('?' + d for d in dims)}" if dims
                   else "its argument shapes are all static")
            raise TilefoldError(f"--bind {name}={text}: @{fn.name} has no dim ?{name} ({has})")
        try:
            size = int(text)
        except ValueError:
            size = -1
        if size < 0:
            raise TilefoldError(f"--bind {name}={text}: a size is a whole number >= 0")
        bindings[name] = size
    return bindings


DEFAULT_SIZE = 128  # of a symbolic dim --bind leaves unbound


def bind_or_default(items: list[str], fn: Function) -> dict[str, int]:
    """Every symbolic dim of `fn` sized: by `--bind DIM=SIZE`, else DEFAULT_SIZE with a note."""
    bindings = parse_bindings(items, fn)
    for name in symbolic_dims(fn):
        if name not in bindings:
            bindings[name] = DEFAULT_SIZE
            print(f"note: ?{name} is not bound: using {DEFAULT_SIZE} (--bind {name}=SIZE)",
                  file=sys.stderr)
    return bindings


def npy_header(path: str, flag: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a `.npy` file declares, read without reading its data."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version not in readers:
                raise ValueError(f".npy format version {version} is not supported")
            shape, _, dtype = readers[version](f)
    except OSError as exc:
        raise TilefoldError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TilefoldError(f"{flag}: {path} is not a .npy file (numpy.save writes them): "
                            f"{exc}") from None
    return shape, dtype


def check_input(arg: Value, shape: tuple[int, ...], dtype: np.dtype, flag: str,
                bound_by: dict[str, str], bindings: dict[str, int]) -> None:
    """Check a given array's declared shape and dtype against `arg`'s type, adding the sizes
    of its symbolic dims to `bindings` (`bound_by` says where each size came from)."""
    t = arg.type
    try:
        given = dtypes.dtype(dtype)
    except DTypeError:
        given = t.dtype if dtype.kind == "V" and dtype.itemsize == t.dtype.itemsize else None
    if given != t.dtype:
        raise DTypeError(f"{flag} holds {dtype} elements, but %{arg.name} is {t}; convert it "
                         "(e.g. array.astype(...)) and save it again")
    if len(shape) != t.rank:
        raise ShapeError(f"{flag} has shape {list(shape)}, but %{arg.name} is {t} "
                         f"(rank {t.rank})")
    for d, size in zip(t.shape, shape, strict=True):
        if not isinstance(d, SymDim):
            if d != size:
                raise ShapeError(f"{flag} has shape {list(shape)}, but %{arg.name} is {t}")
        elif bindings.setdefault(d.name, size) != size:
            raise ShapeError(f"{flag} has shape {list(shape)}, so ?{d.name} = {size} for "
                             f"%{arg.name} ({t}), but {bound_by[d.name]} makes it "
                             f"{bindings[d.name]}")
        else:
            bound_by.setdefault(d.name, flag)


def read_npy(path: str, arg: Value, flag: str) -> np.ndarray:
    """The array in a `.npy` file whose header `check_input` accepted."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise TilefoldError(f"{flag}: cannot load {path}: {exc}") from None
    dtype = arg.type.dtype.np_dtype
    return array.view(dtype) if array.dtype != dtype else array
