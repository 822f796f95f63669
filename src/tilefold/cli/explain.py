"""`tilefold explain FILE`: per fused group, every method family's candidates, costs and winner;
for a module on a device mesh, the sharding rule behind each op's placement."""

from __future__ import annotations

import argparse
import math
import os

from tilefold.cli.inputs import DEFAULT_SIZE, bind_or_default, load_function
from tilefold.ir.limits import check_function
from tilefold.strategy import FAMILIES, Decision


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="show how each fused group is implemented and why",
        description="Fuse FILE, then list for each group the candidates of every kernel method "
        "(or why a method does not apply), estimated and measured costs, and the winner.",
    )
    p.add_argument("file", help="an IR file (.tfir)")
    p.add_argument("--function", default="main", help="function to explain (default: main)")
    p.add_argument("--bind", action="append", default=[], metavar="DIM=SIZE",
                   help=f"size of a symbolic dim, e.g. --bind batch=8 (default {DEFAULT_SIZE})")
    p.add_argument("--tune", action="store_true", help="measure candidates now (TILEFOLD_TUNE=1)")
    p.add_argument("--kernel-ir", action="store_true", help="print each winner's kernel IR")
    p.add_argument("--asm", action="store_true", help="print each winner's assembly")
    p.set_defaults(handler=handle)


def compile_file(path: str, function: str, bind: list[str]):
    """`tilefold.compile` of `function` in the IR file, and its argument shapes with symbolic
    dims bound by `bind` ("DIM=SIZE" texts; DEFAULT_SIZE, with a note, when unbound)."""
    from tilefold.compiler import compile

    module, fn = load_function(path, function)
    bindings = bind_or_default(bind, fn)
    check_function(fn, bindings, module.source_text)
    graph = compile(module, function=function)
    shapes = [tuple(a.type.bind(bindings).shape) for a in graph.function.args]
    return graph, shapes


def explain_sharding(path: str, function: str) -> None:
    """For a module placed on a mesh: the rule that places each op, or that none does and it
    runs replicated (its kernels are chosen per rank, after `tilefold shard` partitions it)."""
    from tilefold.distributed.propagate import explain

    module, _ = load_function(path, function)
    print(f"# tilefold explain {path} @{function}: sharding on "
          + ", ".join(m.declaration() for m in module.meshes.values()))
    for line in explain(module, function):
        print(f"# sharding: {line}")
    print("# kernels are chosen per rank: see `tilefold shard` for the partitioned program")


def handle(args: argparse.Namespace) -> int:
    if args.tune:
        os.environ["TILEFOLD_TUNE"] = "1"
    module, _ = load_function(args.file, args.function)
    if module.meshes:
        explain_sharding(args.file, args.function)
        return 0
    graph, shapes = compile_file(args.file, args.function, args.bind)
    print(f"# tilefold explain {args.file} @{args.function} on "
          + ", ".join(f"[{','.join(map(str, s))}]" for s in shapes))
    for refusal in graph.refusals:
        print(f"# fusion: {refusal}")
    plan = graph.plan_for(*shapes)
    for name, how in plan.layout.items():
        print(f"# layout: %{name} is a {how} of its operand "
              + ("(no kernel, no copy)" if how == "view" else "(NumPy cannot view it: copied)"))
    decisions = plan.decisions
    for i, decision in enumerate(decisions, 1):
        print()
        print(format_decision(decision, i, len(decisions)))
        if args.kernel_ir:
            print(decision.kernel.source)
        if args.asm:
            print(decision.kernel.asm() or "// (no native code: extern)")
    return 0


def format_ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "inf" if not math.isfinite(seconds) else f"{seconds * 1e3:.3f} ms"


def format_decision(d: Decision, index: int, total: int) -> str:
    """The table `explain` prints for one group."""
    p = d.problem
    ins = ", ".join(str(t) for t in p.in_types())
    lines = [f"group {index}/{total}: {' -> '.join(p.names)} ({p.kind}) on ({ins})",
             f"  {'family':<16} {'method / config':<44} {'estimate':>10} {'measured':>10}  note"]
    for family in FAMILIES:
        rows = [c for c in d.candidates if c.family == family]
        for c in rows:
            mark = "*" if c is d.winner else " "
            status = d.failures.get(c.key, c.note)
            lines.append(f"{mark} {family:<16} {c.key:<44} {format_ms(c.estimate):>10} "
                         f"{format_ms(d.measured.get(c.key)):>10}  {status}")
        for r in (r for r in d.rejections if r.family == family):
            lines.append(f"  {family:<16} {r.method:<44} {'-':>10} {'-':>10}  "
                         f"not applicable: {r.reason}")
    winner = d.winner.key if d.winner else "none"
    lines.append(f"  winner: {winner}: {d.why}")
    return "\n".join(lines)
