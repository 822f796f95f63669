"""`tilefold run FILE`: interpret a module on random or given inputs and show or save outputs."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tilefold.errors import ShapeError, TilefoldError
from tilefold.ir import interpret, parse_file, verify
from tilefold.ir.types import SymDim, TensorType


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
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--output-dir", type=Path, help="save each output as NAME.npy here")
    p.add_argument("--resource-dir", type=Path, help="directory of side-file constants")
    p.set_defaults(handler=handle)


def random_input(t: TensorType, bindings: dict[str, int], rng: np.random.Generator) -> np.ndarray:
    """Random values of type `t`: normal floats, small ints, random bools."""
    shape = []
    for d in t.shape:
        if isinstance(d, SymDim):
            if d.name not in bindings:
                raise ShapeError(f"input of type {t} needs a size for ?{d.name}: --bind {d.name}=N")
            d = bindings[d.name]
        shape.append(d)
    if t.dtype.is_float:
        return rng.standard_normal(shape).astype(t.dtype.np_dtype)
    if t.dtype.kind == "bool":
        return rng.random(shape) < 0.5
    return rng.integers(-8 if t.dtype.kind == "int" else 0, 8, shape).astype(t.dtype.np_dtype)


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise TilefoldError(f"{what} expects NAME=VALUE, got {item!r}")
        pairs[name.lstrip("%")] = value
    return pairs


def handle(args: argparse.Namespace) -> int:
    module = verify(parse_file(args.file, args.resource_dir))
    fn = module.functions.get(args.function)
    if fn is None:
        raise TilefoldError(f"{args.file} has no function @{args.function}")
    given = parse_pairs(args.input, "--input")
    try:
        bindings = {k: int(v) for k, v in parse_pairs(args.bind, "--bind").items()}
    except ValueError as exc:
        raise TilefoldError(f"--bind sizes must be integers ({exc})") from None
    unknown = set(given) - {a.name for a in fn.args}
    if unknown:
        raise TilefoldError(f"@{fn.name} has no argument(s) {', '.join(sorted(unknown))}")
    rng = np.random.default_rng(args.seed)
    inputs = []
    for arg in fn.args:
        if arg.name in given:
            try:
                inputs.append(np.load(given[arg.name], allow_pickle=False))
            except (OSError, ValueError) as exc:
                raise TilefoldError(f"cannot load {given[arg.name]}: {exc}") from None
        else:
            inputs.append(random_input(arg.type, bindings, rng))
    outputs = interpret(fn, *inputs)
    names = [v.name for v in fn.outputs]
    for name, out in zip(names, outputs, strict=True):
        if args.output_dir is not None:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            np.save(args.output_dir / f"{name}.npy", out)
        with np.printoptions(precision=5, threshold=20, edgeitems=3):
            print(f"%{name}: {out.dtype}{list(out.shape)}\n{out}")
    return 0
