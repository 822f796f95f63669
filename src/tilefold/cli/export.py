"""`tilefold export FILE -o OUT`: compile a module for static shapes (or symbolic dims within
bounds: `--dynamic s=1:128 --dynamic batch=1:4`) and write the artifact that `tilefold.load`
runs with NumPy alone (`tilefold.aot.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tilefold.cli.inputs import load_function, parse_bindings, symbolic_dims
from tilefold.errors import TilefoldError
from tilefold.frontend.aot_export import export
from tilefold.ir.dims import Bindings
from tilefold.target import named_target


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="compile a module into an artifact tilefold.load runs")
    p.add_argument("file", help="IR file (.tfir)")
    p.add_argument("-o", "--output", required=True, type=Path,
                   help="the artifact directory to write (an artifact there is replaced)")
    p.add_argument("--function", default="main", help="function to export (default: main)")
    p.add_argument("--bind", action="append", default=[], metavar="DIM=SIZE",
                   help="size of a symbolic dim (an artifact has static shapes: bind them all)")
    p.add_argument("--dynamic", action="append", default=[], metavar="DIM=MIN:MAX",
                   help="leave a symbolic dim symbolic: the artifact serves every size MIN..MAX "
                        "(repeat it for several dims; size classes, see docs/ARCHITECTURE.md)")
    p.add_argument("--c", action="store_true", dest="c_library",
                   help="also write libtilefold_model.so, a smaller library for C programs "
                        "alone (the C ABI of tilefold_model.h its only exports, stripped)")
    p.add_argument("--target", default="host",
                   help="target to compile for, e.g. x86-64-v3 (default: this host)")
    p.add_argument("--targets", metavar="T1,T2,...",
                   help="a chain of targets, strongest first, e.g. znver4,x86-64-v3: one "
                        "library each, the loaders run the first the host has (this host "
                        "must run the last; each one it runs gets a plan of its own, the "
                        "others run the last's)")
    p.add_argument("--resource-dir", type=Path,
                   help="directory of side-file constants (default: the file's directory)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    module, fn = load_function(args.file, args.function, args.resource_dir)
    bindings = Bindings(parse_bindings(args.bind, fn))
    dynamic = {}
    for spec in args.dynamic:
        name, _, bounds = spec.partition("=")
        low, _, high = bounds.partition(":")
        try:
            dynamic[name.lstrip("?")] = (int(low), int(high))
        except ValueError:
            raise TilefoldError(f"--dynamic {spec!r}: write DIM=MIN:MAX, e.g. s=1:128") \
                from None
        bindings[name.lstrip("?")] = int(low)
    unbound = [d for d in symbolic_dims(fn) if d not in bindings]
    if unbound:
        raise TilefoldError("bind every symbolic dim: "
                            + ", ".join(f"--bind {d}=SIZE (or --dynamic {d}=MIN:MAX)"
                                        for d in unbound))
    # The plan is run once while recording it: the values do not shape the program.
    inputs = [np.zeros([d if isinstance(d, int) else bindings[d.name] for d in a.type.shape],
                       a.type.dtype.np_dtype) for a in fn.args]
    target = None if args.target == "host" else named_target(args.target)
    targets = None
    if args.targets is not None:
        if target is not None:
            raise TilefoldError("give --target or --targets, not both")
        targets = [t.strip() for t in args.targets.split(",")]
    path = export(module, inputs, args.output, target=target, function=args.function,
                  dynamic_shapes=dynamic or None, c_library=args.c_library, targets=targets)
    print(f"wrote {path} (load it with tilefold.load({str(path)!r}))")
    return 0
