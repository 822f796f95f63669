"""`tilefold shard FILE --mesh tp=8`: plan how a program is split over a device mesh, and
print the plan, the partitioned IR (global types with placements, collectives expanded) and
the cost table per device. Planning only: nothing runs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from tilefold.errors import TilefoldError

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tilefold.distributed import DEVICES, LINKS, STRATEGIES

    p = sub.add_parser("shard", description=__doc__,
                       help="plan a program over a device mesh: plan, partitioned IR, cost table")
    p.add_argument("file", help="an IR file (.tfir)")
    p.add_argument("--mesh", help="mesh axes, e.g. tp=8 or dp=2,tp=4 (default: the file's "
                   "one mesh, for --strategy propagate)")
    p.add_argument("--strategy", default="ilp", choices=sorted(STRATEGIES),
                   help="how to choose the plan (default: ilp)")
    p.add_argument("--plan", metavar="PLAN", help="apply this plan file instead of searching")
    p.add_argument("--memory-limit", metavar="SIZE", help="bytes per device, e.g. 16GB, 80GiB")
    p.add_argument("--training", action="store_true",
                   help="judge a training step (forward, backward, gradient all_reduces)")
    p.add_argument("--pad", action="store_true",
                   help="allow uneven splits as padded shards S(d,pad) (blocks of ceil(size/n))")
    p.add_argument("--function", default="main", help="function to plan (default: main)")
    p.add_argument("--bind", action="append", default=[], metavar="DIM=SIZE",
                   help="size of a symbolic dim, e.g. --bind batch=8 (plans are for sizes; "
                   "default 128)")
    p.add_argument("--data", action="append", metavar="NAME",
                   help="an argument that carries the batch (default: the first)")
    p.add_argument("--device", default="h100", choices=sorted(DEVICES),
                   help="the device roofline (default: h100)")
    p.add_argument("--link", action="append", default=[], metavar="AXIS=CLASS",
                   help=f"the link class of a mesh axis ({', '.join(LINKS)}, or measured: what "
                   "`tilefold tune --comm` fitted here); default: "
                   "nvlink within a node of 8, ib beyond")
    p.add_argument("--detail", action="store_true", help="one cost row per op and collective")
    p.add_argument("--no-ir", action="store_true", help="leave out the partitioned IR")
    p.set_defaults(handler=handle)


def parse_size(text: str) -> int:
    """`16GB`, `80GiB`, `512MB` or a plain number of bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if m is None or m.group(2).upper() not in UNITS:
        raise TilefoldError(f"--memory-limit {text!r}: write a size such as 16GB, 80GiB or "
                            "512MB")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def handle(args: argparse.Namespace) -> int:
    from tilefold.cli.inputs import bind_or_default, load_function
    from tilefold.distributed import (
        DEVICES,
        AlphaBeta,
        Constraints,
        Plan,
        parse_mesh,
        plan_cost,
    )
    from tilefold.distributed.strategies import get_strategy
    from tilefold.ir import print_module
    from tilefold.passes.shape_inference import ShapeInference

    module, fn = load_function(args.file, args.function)
    bindings = bind_or_default(args.bind, fn)
    if bindings:  # a plan's splits, costs and memory are for sizes
        ShapeInference(bind=bindings).run(module)
    plan = Plan.parse(Path(args.plan).read_text()) if args.plan else None
    mesh = parse_mesh(args.mesh) if args.mesh else plan.mesh if plan else None
    if plan is not None and mesh != plan.mesh:
        raise TilefoldError(f"--mesh {args.mesh} is not the plan's {plan.mesh.declaration()}")
    if mesh is None and len(module.meshes) == 1:
        mesh = next(iter(module.meshes.values()))
    if mesh is None:
        raise TilefoldError(f"{args.file} declares {len(module.meshes)} meshes: give one with "
                            "--mesh, e.g. --mesh tp=8")
    links = dict(item.partition("=")[::2] for item in args.link)
    constraints = Constraints(
        memory_limit=parse_size(args.memory_limit) if args.memory_limit else None,
        training=args.training, function=args.function, pad=args.pad,
        data=tuple(args.data) if args.data else None)
    cost = AlphaBeta(mesh, device=DEVICES[args.device], links=links)
    if plan is None:
        plan = get_strategy(args.strategy).search(module, mesh, cost, constraints)
    partitioned, estimate = plan_cost(plan, module, cost, constraints)
    print(f"# plan ({plan.strategy or 'from ' + str(args.plan)})")
    print(plan.text, end="")
    if not args.no_ir:
        print("\n# partitioned IR")
        print(print_module(partitioned), end="")
    step = "training step" if args.training else "forward"
    print(f"\n# cost per device ({cost.name}, {cost.device.name}, {step})")
    print(estimate.table(detail=args.detail))
    peak = cost.peak_memory(partitioned.functions[args.function])
    limit = f" (limit {constraints.memory_limit / 2**30:.2f} GiB)" if args.memory_limit else ""
    print(f"# peak memory per device: {peak / 2**30:.3f} GiB{limit}")
    return 0
