"""`tilefold info`: what this host is, as tilefold sees it, and the versions it runs with."""

from __future__ import annotations

import argparse
import json
import platform

import llvmlite
import ml_dtypes
import numpy as np

from tilefold.codegen.llvm.gemm.describe import describe as describe_gemm
from tilefold.codegen.llvm.lowp.kernels import describe_lowp
from tilefold.target import cache_dir, host_target, named_target
from tilefold.target.host_cpu import host_cpu
from tilefold.version import __version__


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe the host (CPU, ISA features, caches, versions)")
    p.add_argument("--target", default="host", help="describe a named target instead")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=handle)


def _kib(n: int) -> str:
    return f"{n // 1024} KiB" if n < 1 << 20 else f"{n / (1 << 20):g} MiB"


def _forced(target) -> str:
    """Says when TILEFOLD_HOST makes this machine act as a weaker target."""
    machine = host_cpu().name
    return "" if target.cpu == machine else f" (TILEFOLD_HOST; the machine is {machine})"


def _blocking_source(tuned: dict | None) -> str:
    """Where a GEMM's blocking came from: the cache model, or a measurement on this machine."""
    if tuned is None:
        return "model blocking (`tune --gemm` measures)"
    mc, kc, nc = tuned["model"]
    return f"measured blocking, {tuned['speedup']:.2f}x the model's MC={mc} KC={kc} NC={nc}"


def _gemv_source(tuned: dict | None) -> str:
    """Where a GEMV form's parameters came from."""
    if tuned is None:
        return "model (`tune --gemm` measures)"
    ahead, panel = tuned["model"]
    return f"measured, {tuned['speedup']:.2f}x the model's ahead={ahead} panel={panel}"


def describe(target_name: str) -> dict:
    from tilefold.runtime import num_threads

    target = host_target() if target_name == "host" else named_target(target_name)
    described = describe_gemm(target)
    gemm = {
        f"gemm f32 ({name})": f"{c['microkernel']} ({c['mr']}x{c['nr']}"
        + (f", N <= {c['max_n']}" if c["max_n"] else "") + "), "
        f"MC={c['blocking']['mc']} KC={c['blocking']['kc']} NC={c['blocking']['nc']}, "
        f"{c['loop_order']}, {_blocking_source(c['tuned'])}"
        for name, c in described["shape_classes"].items()
    }
    gemv = {f"gemv f32 ({form})": f"{g['text']}, {_gemv_source(g['tuned'])}"
            for form, g in described["gemv"].items()}
    lowp = {f"gemm {line.split(':')[0]}": line.split(": ", 1)[1] for line in describe_lowp(target)}
    return {
        "target": target.name + (_forced(target) if target_name == "host" else ""),
        "arch": target.arch,
        "triple": target.triple,
        "llvm cpu": target.cpu,
        "vector": f"{target.vector_bits}-bit x {target.vector_registers} registers",
        "features": " ".join(sorted(target.features)),
        "family": " -> ".join(target.family),
        "caches": f"L1d {_kib(target.l1d_bytes)}, L2 {_kib(target.l2_bytes)}, "
        f"L3 {_kib(target.l3_bytes)}",
        "cores": target.cores,
        "threads": num_threads(),
        **gemm,
        **gemv,
        **lowp,
        "cache dir": str(cache_dir()),
        "versions": f"tilefold {__version__}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
        f"llvmlite {llvmlite.__version__}",
    }


def handle(args: argparse.Namespace) -> int:
    facts = describe(args.target)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    width = max(map(len, facts))
    for key, value in facts.items():
        print(f"{key:>{width}}: {value}")
    return 0
