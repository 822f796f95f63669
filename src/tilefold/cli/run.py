"""`tilefold run FILE`: interpret a module on random or given inputs and show or save outputs."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tilefold.cli.inputs import (
    check_input,
    count,
    load_function,
    npy_header,
    parse_bindings,
    parse_pairs,
    read_npy,
    symbolic_dims,
)
from tilefold.errors import ShapeError, TilefoldError
from tilefold.ir import Function, interpret
from tilefold.ir.limits import check_function
from tilefold.ir.types import TensorType


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a module with the reference interpreter")
    p.add_argument("file", help="IR file (.tfir)")
    p.add_argument("--function", default="main", help="function to run (default: main)")
    p.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy",
        help="an input array for argument %%NAME (others are random)",
    )
    p.add_argument(
        "--bind", action="append", default=[], metavar="DIM=SIZE",
        help="size of a symbolic dim for random inputs, e.g. --bind batch=8",
    )
    p.add_argument("--seed", type=count(0), default=0, help="seed of the random inputs")
    p.add_argument("--output-dir", type=Path, help="save each output as NAME.npy here")
    p.add_argument("--resource-dir", type=Path,
                   help="directory of side-file constants (default: the file's directory)")
    p.set_defaults(handler=handle)


def random_input(t: TensorType, rng: np.random.Generator) -> np.ndarray:
    """Random values of the static type `t`: normal floats, small ints, random bools."""
    shape = t.shape
    if t.dtype.is_float:
        return rng.standard_normal(shape).astype(t.dtype.np_dtype)
    if t.dtype.kind == "bool":
        return rng.random(shape) < 0.5
    return rng.integers(-8 if t.dtype.kind == "int" else 0, 8, shape).astype(t.dtype.np_dtype)


def bind_inputs(fn: Function, given: dict[str, str], bind: list[str]) -> dict[str, int]:
    """Every symbolic dim's size, from `--bind` and the given arrays' headers, all checked
    against each other and `fn`'s argument types before any array is read."""
    unknown = set(given) - {a.name for a in fn.args}
    if unknown:
        known = ", ".join(f"%{a.name}" for a in fn.args) or "none"
        raise TilefoldError(f"@{fn.name} has no argument(s) "
                            f"{', '.join('%' + n for n in sorted(unknown))} (it has: {known})")
    bindings = parse_bindings(bind, fn)
    bound_by = {name: f"--bind {name}={size}" for name, size in bindings.items()}
    for arg in fn.args:
        if arg.name in given:
            flag = f"--input {arg.name}={given[arg.name]}"
            shape, dtype = npy_header(given[arg.name], flag)
            check_input(arg, shape, dtype, flag, bound_by, bindings)
    missing = [d for d in symbolic_dims(fn) if d not in bindings]
    if missing:
        raise ShapeError(f"@{fn.name} has symbolic dims without a size: "
                         + ", ".join(f"?{d}" for d in missing) + "; give each one, e.g. "
                         + " ".join(f"--bind {d}=8" for d in missing))
    return bindings


def handle(args: argparse.Namespace) -> int:
    module, fn = load_function(args.file, args.function, args.resource_dir)
    given = parse_pairs(args.input, "--input", "%")
    bindings = bind_inputs(fn, given, args.bind)
    check_function(fn, bindings, module.source_text)
    rng = np.random.default_rng(args.seed)
    inputs = [read_npy(given[a.name], a, f"--input {a.name}") if a.name in given
              else random_input(a.type.bind(bindings), rng) for a in fn.args]
    outputs = interpret(fn, *inputs)
    for value, out in zip(fn.outputs, outputs, strict=True):
        if args.output_dir is not None:
            save(args.output_dir / f"{value.name}.npy", out)
        with np.printoptions(precision=5, threshold=20, edgeitems=3):
            print(f"%{value.name}: {out.dtype}{list(out.shape)}\n{out}")
    return 0


def save(path: Path, array: np.ndarray) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, array)
    except OSError as exc:
        raise TilefoldError(f"--output-dir: cannot write {path}: {exc.strerror or exc}") from None
