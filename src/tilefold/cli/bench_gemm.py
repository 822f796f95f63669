"""GEMM benchmark: tilefold against NumPy (OpenBLAS) and PyTorch, same process, interleaved.

Each (shape, thread count) is timed in rounds; in a round every implementation runs a block of
calls after a warm-up, then sleeps so its spinning worker threads (OpenBLAS, OpenMP, tilefold)
settle before the next one is timed. Reported figures are medians over all timed calls.
BLAS and torch threads are limited to the same count as tilefold's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, TextIO

import numpy as np

from tilefold.cli.benchutil import Shape, geomean, parse_shape
from tilefold.runtime.timing import interleaved_medians, time_block


@dataclass
class Row:
    shape: Shape
    threads: int
    gflops: dict[str, float] = field(default_factory=dict)
    pct_peak: float = 0.0
    max_rel_err: float = 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", action="append", default=[], metavar="[Bx]MxNxK",
                        help="benchmark this shape instead of the suite (repeatable)")
    parser.add_argument("--threads", default=None,
                        help="comma-separated thread counts (default: 1 and all cores)")
    parser.add_argument("--dtype", default="f32", choices=["f32"], help="element type")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape")
    parser.add_argument("--block-seconds", type=float, default=0.15,
                        help="timed seconds per implementation per round")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="draw GFLOP/s bars (matplotlib)")


def suite() -> list[Shape]:
    text = resources.files("tilefold.data").joinpath("gemm_shapes.json").read_text()
    return [Shape(s["name"], s["batch"], s["m"], s["n"], s["k"])
            for s in json.loads(text)["shapes"]]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def bench_shape(shape: Shape, threads: int, args: argparse.Namespace, torch: Any) -> Row:
    from threadpoolctl import threadpool_limits

    from tilefold.linalg import matmul

    rng = np.random.default_rng(0)
    lead = (shape.batch,) if shape.batch > 1 else ()
    a = rng.standard_normal((*lead, shape.m, shape.k), dtype=np.float32)
    b = rng.standard_normal((*lead, shape.k, shape.n), dtype=np.float32)
    c_tf = np.empty((*lead, shape.m, shape.n), np.float32)
    c_np = np.empty_like(c_tf)
    impls = {"tilefold": lambda: matmul(a, b, out=c_tf, threads=threads),
             "numpy": lambda: np.matmul(a, b, out=c_np)}
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        tc = torch.from_numpy(np.empty_like(c_tf))
        impls["torch"] = lambda: torch.matmul(ta, tb, out=tc)
        torch.set_num_threads(threads)
    with threadpool_limits(limits=threads):
        medians = interleaved_medians(impls, args.rounds,
                                      lambda fn: time_block(fn, args.block_seconds))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.max(np.abs(ref)) or 1.0
    row = Row(shape, threads)
    row.max_rel_err = float(np.max(np.abs(c_tf - ref)) / scale)
    for name, seconds in medians.items():
        row.gflops[name] = shape.flops / seconds / 1e9
    return row


def print_table(rows: list[Row], peak: float, threads: int, out: TextIO = sys.stdout
                ) -> dict[str, float]:
    peers = [p for p in ("numpy", "torch") if p in rows[0].gflops]
    head = f"{'shape':<14}{'B':>4}{'M':>6}{'N':>6}{'K':>6}{'tilefold':>10}{'%peak':>7}"
    head += "".join(f"{p:>9}" for p in peers) + "".join(f"{'vs ' + p:>10}" for p in peers)
    print(f"\nfp32, {threads} thread(s), measured peak {peak:.1f} GFLOP/s; figures in GFLOP/s",
          file=out)
    print(head, file=out)
    ratios: dict[str, list[float]] = {p: [] for p in peers}
    for r in rows:
        s, tf = r.shape, r.gflops["tilefold"]
        line = f"{s.name:<14}{s.batch:>4}{s.m:>6}{s.n:>6}{s.k:>6}{tf:>10.1f}"
        line += f"{100 * tf / peak:>6.0f}%"
        line += "".join(f"{r.gflops[p]:>9.1f}" for p in peers)
        for p in peers:
            ratios[p].append(tf / r.gflops[p])
            line += f"{tf / r.gflops[p]:>9.2f}x"
        if r.max_rel_err > 1e-4:
            line += f"  MISMATCH {r.max_rel_err:.1e}"
        print(line, file=out)
    means = {p: geomean(v) for p, v in ratios.items()}
    print(f"{'geomean':<46}" + " " * 9 * len(peers)
          + "".join(f"{means[p]:>9.2f}x" for p in peers), file=out)
    return means


def plot(results: dict[int, list[Row]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench gemm: --plot needs matplotlib (pip install matplotlib); no plot written",
              file=sys.stderr)
        return
    fig, axes = plt.subplots(len(results), 1, figsize=(14, 4.5 * len(results)), squeeze=False)
    for ax, (threads, rows) in zip(axes[:, 0], results.items(), strict=True):
        names = list(rows[0].gflops)
        x = np.arange(len(rows))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ax.bar(x + i * width, [r.gflops[name] for r in rows], width, label=name)
        ax.set_xticks(x + 0.4 - width / 2, [r.shape.name for r in rows], rotation=45, ha="right")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"fp32 GEMM, {threads} thread(s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


_COMPILE_PROBE = """
import time
from tilefold.runtime import thread_pool
thread_pool()  # the pool's own module is not the GEMM's compile time
from tilefold.codegen.gemm.module import gemm_module
from tilefold.codegen.gemm.registry import SHAPE_CLASSES, select_microkernel
from tilefold.target import host_target
target = host_target()
for shape_class in SHAPE_CLASSES:
    start = time.perf_counter()
    module = gemm_module(target, select_microkernel(target, shape_class=shape_class))
    module.entries  # modules compile on first use
    print(shape_class, module.kernel.name, (time.perf_counter() - start) * 1e3)
"""


def compile_times() -> list[tuple[str, str, float, float]]:
    """(shape class, micro-kernel, cold ms, cached ms): first use of each GEMM module in a fresh
    process, with an empty kernel cache and then with the cache that run filled."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TILEFOLD_CACHE_DIR": cache}
        runs = [subprocess.run([sys.executable, "-c", _COMPILE_PROBE], env=env, check=True,
                               capture_output=True, text=True).stdout.split("\n")
                for _ in range(2)]
    rows = []
    for cold, warm in zip(runs[0], runs[1], strict=True):
        if cold:
            shape_class, kernel, cold_ms = cold.split()
            rows.append((shape_class, kernel, float(cold_ms), float(warm.split()[2])))
    return rows


def run(args: argparse.Namespace) -> int:
    from tilefold.codegen.gemm.module import gemm_module
    from tilefold.runtime import num_threads
    from tilefold.target import measured_peak_gflops

    shapes = [parse_shape(s) for s in args.shape] or suite()
    counts = ([int(t) for t in args.threads.split(",")] if args.threads
              else sorted({1, num_threads()}))
    torch = None if args.no_torch else _torch()
    module = gemm_module()
    kern = module.kernel
    print(f"tilefold GEMM on {module.target.name}: micro-kernel {kern.name} ({kern.mr}x{kern.nr})")
    compiles = compile_times()
    for shape_class, kernel, cold_ms, warm_ms in compiles:
        print(f"  {shape_class} module ({kernel}), first use in a fresh process: compiled in "
              f"{cold_ms:.1f} ms, from the disk cache in {warm_ms:.1f} ms")
    if torch is None:
        print("PyTorch not installed (or --no-torch): comparing with NumPy only")
    results: dict[int, list[Row]] = {}
    summary = {}
    for threads in counts:
        peak = measured_peak_gflops(threads=threads, refresh=True)  # re-probe: we hold the lock
        rows = [bench_shape(s, threads, args, torch) for s in shapes]
        results[threads] = rows
        summary[threads] = {"peak_gflops": peak, "geomean": print_table(rows, peak, threads)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel": kern.name, "target": module.target.name,
                       "compile_ms": {c[0]: {"kernel": c[1], "cold": c[2], "cached": c[3]}
                                      for c in compiles},
                       "results": {t: [asdict(r) for r in rows] for t, rows in results.items()},
                       "summary": summary}, f, indent=1)
        print(f"results written to {args.json}")
    if args.plot:
        plot(results, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefold.cli.bench_gemm",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
