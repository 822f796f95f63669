"""GEMM benchmark: tilefold against NumPy's BLAS and PyTorch, same process, interleaved.

Each (shape, thread count) is timed in rounds; in a round every implementation runs a block of
calls after warm-up calls, with tilefold's workers parked before a peer runs and a pause after
each block for spinning threads to settle; then each runs alone. Figures are medians.
BLAS and torch threads are limited to the same count as tilefold's. The header names the BLAS
kernels compared with; --blas-coretype and --mkl-isa force them (in a new process, since the
libraries read them when they load), e.g. to measure the AVX2 path against AVX2 libraries on
an AVX-512 host: TILEFOLD_HOST=x86-64-v3 tilefold bench gemm --blas-coretype Haswell
--mkl-isa AVX2.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from typing import Any

import numpy as np

from tilefold.cli import blaslib
from tilefold.cli.benchutil import (
    Bench,
    Row,
    Section,
    Shape,
    Suite,
    fresh_process_runs,
    optional_torch,
    parse_shape,
)
from tilefold.runtime.timing import time_block

MISMATCH = 1e-4  # max error relative to the output's largest magnitude


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", action="append", default=[], metavar="[Bx]MxNxK",
                        help="benchmark this shape instead of the suite (repeatable)")
    parser.add_argument("--dtype", default="f32", choices=["f32"], help="element type")
    parser.add_argument("--block-seconds", type=float, default=0.15,
                        help="timed seconds per implementation per round")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--no-compile-times", action="store_true",
                        help="skip timing the GEMM modules' compiles in new processes")
    parser.add_argument("--blas-coretype", metavar="NAME",
                        help=f"force NumPy's OpenBLAS to this core type ({blaslib.CORETYPE}, "
                             "e.g. Haswell, SkylakeX, Zen)")
    parser.add_argument("--mkl-isa", metavar="ISA",
                        help=f"force MKL (PyTorch's BLAS) to this ISA ({blaslib.MKL_ISA}, "
                             "e.g. AVX2, AVX512)")


def suite() -> list[Shape]:
    text = resources.files("tilefold.data").joinpath("gemm_shapes.json").read_text()
    return [Shape(s["name"], s["batch"], s["m"], s["n"], s["k"])
            for s in json.loads(text)["shapes"]]


def bench_shape(shape: Shape, threads: int, args: argparse.Namespace, torch: Any,
                bench: Bench) -> Row:
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
        timings = bench.measure(impls, lambda fn: time_block(fn, args.block_seconds),
                                warm_calls=0)  # a block starts with two untimed calls
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.max(np.abs(c_tf - ref)) / (np.max(np.abs(ref)) or 1.0))
    return Row(shape.name, f"{shape.name:<14}{shape.batch:>4}{shape.m:>6}{shape.n:>6}{shape.k:>6}",
               timings, work=dict.fromkeys(impls, shape.flops),
               note=f"  MISMATCH {err:.1e}" if err > MISMATCH else "",
               info={"batch": shape.batch, "m": shape.m, "n": shape.n, "k": shape.k,
                     "max_rel_err": err})


_COMPILE_PROBE = """
import time
from tilefold.runtime.thread_pool import thread_pool
thread_pool()  # the pool's own module is not the GEMM's compile time
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.registry import SHAPE_CLASSES, select_microkernel
from tilefold.target import host_target
target = host_target()
for shape_class in SHAPE_CLASSES:
    start = time.perf_counter()
    module = gemm_module(target, select_microkernel(target, shape_class=shape_class))
    module.entries  # modules compile on first use
    print(shape_class, module.kernel.name, (time.perf_counter() - start) * 1e3)
"""


def compile_times() -> dict[str, dict[str, Any]]:
    """Per shape class: its micro-kernel and first-use ms in a fresh process, `cold` with an
    empty kernel cache and `cached` with the cache that run filled."""
    runs = fresh_process_runs([sys.executable, "-c", _COMPILE_PROBE], "GEMM module compile",
                              kinds=("cold", "cached"))
    found: dict[str, dict[str, Any]] = {}
    for kind, stdout in runs.items():
        for line in stdout.splitlines():
            shape_class, kernel, ms = line.split()
            found.setdefault(shape_class, {"kernel": kernel})[kind] = float(ms)
    return found


def _child_argv(args: argparse.Namespace) -> list[str]:
    """This run's arguments, for the same run in a new process."""
    argv = ["bench", "gemm", "--rounds", str(args.rounds), "--threads", args.threads,
            "--dtype", args.dtype, "--block-seconds", str(args.block_seconds)]
    argv += [a for s in args.shape for a in ("--shape", s)]
    flags = {"--no-torch": args.no_torch, "--no-compile-times": args.no_compile_times}
    argv += [flag for flag, on in flags.items() if on]
    options = {"--blas-coretype": args.blas_coretype, "--mkl-isa": args.mkl_isa,
               "--json": args.json, "--plot": args.plot}
    return argv + [a for flag, value in options.items() if value for a in (flag, value)]


def run(args: argparse.Namespace, bench: Bench) -> int:
    forced = blaslib.forced_env(args.blas_coretype, args.mkl_isa)
    if blaslib.needs_new_process(forced):
        child = _child_argv(args)
        args.json = args.plot = None  # the new process writes them
        return blaslib.rerun(child, forced)
    return _run(args, bench)


def _run(args: argparse.Namespace, bench: Bench) -> int:
    from tilefold.codegen.llvm.gemm.module import gemm_module
    from tilefold.target import measured_peak_gflops

    shapes = [parse_shape(s) for s in args.shape] or suite()
    torch = None if args.no_torch else optional_torch()
    module = gemm_module()
    kern = module.kernel
    bench.note(f"tilefold GEMM on {module.target.name}: micro-kernel {kern.name} "
               f"({kern.mr}x{kern.nr})")
    info = blaslib.numpy_blas()
    bench.note(f"numpy: {blaslib.describe_numpy_blas(info)}")
    warning = blaslib.coretype_mismatch(info)
    if warning:
        bench.note(warning)
    if torch is None:
        bench.note("PyTorch not installed (or --no-torch): comparing with NumPy only")
    else:
        bench.note(f"torch: {blaslib.describe_torch_blas(torch)}")
    bench.extra.update(kernel=kern.name, target=module.target.name, numpy_blas=info)
    if not args.no_compile_times:
        compiles = compile_times()
        for shape_class, c in compiles.items():
            bench.note(f"  {shape_class} module ({c['kernel']}), first use in a fresh process: "
                       f"compiled in {c.get('cold', float('nan')):.1f} ms, from the disk cache "
                       f"in {c.get('cached', float('nan')):.1f} ms")
        bench.extra["compile_ms"] = compiles
    for threads in args.thread_counts:
        peak = measured_peak_gflops(threads=threads, refresh=True)  # re-probe: we hold the lock
        section = Section(f"fp32, {threads} thread(s), measured peak {peak:.1f} GFLOP/s",
                          f"{'shape':<14}{'B':>4}{'M':>6}{'N':>6}{'K':>6}", "GFLOP/s",
                          peak=peak, threads=threads)
        section.rows = [bench_shape(s, threads, args, torch, bench) for s in shapes]
        bench.table(section)
    return 0


SUITE = Suite("gemm", __doc__, add_arguments, run, rounds=3, threads="1,all", multi_threads=True)
