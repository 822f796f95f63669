"""`tilefold emit FILE --target h200`: the Triton source (or sm_90 PTX) of every memory-bound
group of an IR file, fused as `tilefold.compile` fuses it."""

from __future__ import annotations

import argparse

from tilefold.cli.inputs import load_function
from tilefold.errors import UnsupportedError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "emit",
        help="print the GPU kernel source of each memory-bound group",
        description="Fuse FILE as tilefold.compile does, then print the Triton source of every "
        "memory-bound group for a GPU target (or, with --ptx, compile it for the target's "
        "architecture on this machine, no GPU needed, and print the PTX).",
    )
    p.add_argument("file", help="an IR file (.tfir)")
    p.add_argument("--function", default="main", help="function to emit (default: main)")
    p.add_argument("--target", default="h200", help="a GPU target name (default: h200)")
    p.add_argument("--ptx", action="store_true",
                   help="compile each group with Triton and print its PTX (needs triton)")
    p.add_argument("--summary", action="store_true",
                   help="with --ptx: only registers, spills and shared memory per group")
    p.set_defaults(handler=handle)


def memory_groups(path: str, function: str) -> list:
    """The `fused` memory-bound regions of `function` after the compiler's passes and fusion,
    in program order, as (op names, region)."""
    from tilefold.compiler import compile

    module, _ = load_function(path, function)
    fn = compile(module, function=function).function
    return [([inner.name for inner in op.regions[0].ops if inner is not
              op.regions[0].terminator], op.regions[0])
            for op in fn.ops if op.name == "fused" and op.attr("kind") == "memory"]


def handle(args: argparse.Namespace) -> int:
    from tilefold.codegen.backend import get_backend
    from tilefold.codegen.kernel import lower_group
    from tilefold.codegen.triton.schedule import choose_gpu_schedule
    from tilefold.target import gpu_target

    target = gpu_target(args.target)
    backend = get_backend("triton")
    if args.ptx:
        from tilefold.codegen.triton.launch import require_triton
        from tilefold.codegen.triton.ptx import compile_ptx

        require_triton()
        if target.vendor != "nvidia":
            raise UnsupportedError(f"--ptx compiles for NVIDIA GPUs; {target.name} is "
                                   f"{target.vendor}")
    groups = memory_groups(args.file, args.function)
    print(f"# tilefold emit {args.file} @{args.function} for {target}: "
          f"{len(groups)} memory-bound group(s)")
    for i, (names, region) in enumerate(groups, 1):
        kernel, _ = lower_group(region)
        print(f"\n# group {i}/{len(groups)}: {' -> '.join(names)}")
        reason = backend.supports(kernel, target)
        if reason is not None:
            print(f"# not emitted: {reason}")
            continue
        schedule = choose_gpu_schedule(kernel, target)
        if not args.ptx:
            print(backend.source(kernel, schedule, target), end="")
            continue
        report = compile_ptx(kernel, schedule, target)
        print(f"// {report.summary()}")
        if not args.summary:
            print(report.ptx, end="")
    return 0
