"""Memory-bound kernels: softmax, layer_norm, rms_norm against NumPy, eager and torch.compile.

tilefold's generated kernel for each op, in GB/s (input read and output written) and % of the
measured read bandwidth, on shapes from cache-sized to 1.25x the L3; then the call overhead of
a 1x16 softmax. Every sample is a batch of calls lasting about 2 ms; contenders are timed
interleaved, with tilefold's workers parked before a peer runs, and then alone.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np

from tilefold.cli.benchutil import Bench, Row, Section, Suite, optional_torch
from tilefold.runtime.timing import time_batch

SETTLE_SECONDS = 0.01  # a sample is a 2 ms batch
MISMATCH = 1e-4  # max error relative to the output's largest magnitude
PARAMS = {"softmax": 0, "layer_norm": 2, "rms_norm": 1}  # 1-D weight operands after x


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    e /= e.sum(-1, keepdims=True)
    return e


def _np_layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _np_rms_norm(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


NUMPY = {"softmax": _np_softmax, "layer_norm": _np_layer_norm, "rms_norm": _np_rms_norm}


def _torch_ops(torch):
    F = torch.nn.functional
    return {
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5),
        "rms_norm": lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6),
    }


def cases(big_rows: int) -> list[tuple[str, tuple[int, ...]]]:
    return [
        ("softmax", (12, 128, 128)),
        ("softmax", (12, 512, 512)),
        ("softmax", (big_rows, 2048)),
        ("layer_norm", (512, 768)),
        ("layer_norm", (big_rows, 2048)),
        ("rms_norm", (512, 4096)),
        ("rms_norm", (big_rows, 2048)),
    ]


def _group(op: str, shape: tuple[int, ...]):
    from tilefold.ir import functional as F
    from tilefold.ir import trace

    x = ("x", "f32", shape)
    w = ("w", "f32", shape[-1:])
    if op == "softmax":
        return trace(lambda v: F.softmax(v, axis=-1), x)
    if op == "layer_norm":
        return trace(lambda v, a, c: F.layer_norm(v, a, c, eps=1e-5), x, w, ("b", "f32", w[2]))
    return trace(lambda v, a: F.rms_norm(v, a, eps=1e-6), x, w)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", default=[],
                        help="cases whose name (e.g. softmax-12x128x128) has this")
    parser.add_argument("--big-rows", type=int, default=None,
                        help="rows of the 2048-wide cases (default: 1.25x the L3)")
    parser.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile")


def run(args: argparse.Namespace, bench: Bench) -> int:
    (threads,) = args.thread_counts
    os.environ["TILEFOLD_NUM_THREADS"] = str(threads)  # before tilefold's thread pool starts
    from threadpoolctl import threadpool_limits

    from tilefold.target import host_target, measured_bandwidth_gbps

    target = host_target()
    bandwidth = measured_bandwidth_gbps(threads)
    big_rows = args.big_rows or min(int(1.25 * target.l3_bytes) // (2048 * 4), 65536)
    torch = optional_torch()
    if torch is None:
        bench.note("PyTorch not installed: comparing with NumPy only")
    else:
        torch.set_num_threads(threads)
    bench.note(f"{target.name}, {threads} threads, L2 {target.l2_bytes >> 10} KiB/core, "
               f"L3 {target.l3_bytes >> 20} MiB; measured read bandwidth {bandwidth:.1f} GB/s")
    section = Section(f"{threads} thread(s); GB/s of input read and output written",
                      f"{'case':<24}{'MiB in':>8}", "GB/s", peak=bandwidth, threads=threads)
    rng = np.random.default_rng(0)
    with threadpool_limits(limits=threads):
        for op, shape in cases(big_rows):
            name = f"{op}-{'x'.join(map(str, shape))}"
            if not args.only or any(s in name for s in args.only):
                section.rows.append(_bench_case(op, shape, name, rng, args, torch, bench))
        if section.rows:
            bench.table(section)
        bench.table(_overhead(torch, bench))
    return 0


def _contenders(op: str, inputs: tuple, torch, compiled: bool) -> dict[str, Callable[[], object]]:
    from tilefold.codegen.kernel import compile_group

    kernel = compile_group(_group(op, inputs[0].shape)["main"])
    found = {"tilefold": lambda: kernel(*inputs), "numpy": lambda: NUMPY[op](*inputs)}
    if torch is not None:
        targs = tuple(torch.from_numpy(a) for a in inputs)
        eager = _torch_ops(torch)[op]
        found["eager"] = lambda: eager(*targs)
        if compiled:
            fn = torch.compile(_torch_ops(torch)[op], dynamic=False)
            found["compile"] = lambda: fn(*targs)
    return found


def _bench_case(op: str, shape: tuple[int, ...], name: str, rng: np.random.Generator,
                args: argparse.Namespace, torch, bench: Bench) -> Row:
    x = rng.standard_normal(shape, dtype=np.float32)
    inputs = (x, *(rng.standard_normal(shape[-1:], dtype=np.float32) for _ in range(PARAMS[op])))
    found = _contenders(op, inputs, torch, not args.no_torch_compile)
    want = NUMPY[op](*(a.astype(np.float64) for a in inputs))
    got = found["tilefold"]()[0]
    err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) or 1.0))
    timings = bench.measure(found, time_batch, settle=SETTLE_SECONDS)
    nbytes = 2 * x.nbytes + sum(a.nbytes for a in inputs[1:])
    return Row(name, f"{name:<24}{x.nbytes / 2**20:>8.1f}", timings,
               work=dict.fromkeys(timings, nbytes),
               note=f"  MISMATCH {err:.1e}" if err > MISMATCH else "",
               info={"op": op, "shape": list(shape), "bytes": nbytes, "max_rel_err": err})


def _overhead(torch, bench: Bench) -> Section:
    """The cost of a call: a 1x16 softmax."""
    tiny = np.random.default_rng(1).standard_normal((1, 16), dtype=np.float32)
    found = _contenders("softmax", (tiny,), torch, compiled=False)
    timings = bench.measure(found, time_batch, settle=SETTLE_SECONDS)
    return Section("call overhead", f"{'case':<24}", "us",
                   [Row("softmax-1x16", f"{'softmax-1x16':<24}", timings)])


SUITE = Suite("memory", __doc__, add_arguments, run, rounds=15, threads="all")
