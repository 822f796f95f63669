"""Low-precision benchmark: bf16 and int8 GEMMs, weight-only int4/fp4/fp8 GEMV, against fp32.

The comparisons are tilefold's own fp32 and the peers (PyTorch bf16 matmul and `torch._int_mm`,
ONNX Runtime MatMulInteger when installed), timed interleaved in one process and then alone,
like `bench gemm`.

`tilefold` uses B packed once (a weight, as ORT's constant initializer); `tf_unpacked_b` packs
B on every call.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

from tilefold.cli.benchutil import Bench, Row, Section, Shape, Suite, parse_shape
from tilefold.quant import FORMATS, QuantizedTensor, quantize, quantized_matmul
from tilefold.runtime.timing import Timing, time_block

SUITES = {
    "bf16": ["512x512x512", "1024x1024x1024", "2048x2048x2048", "128x3072x768", "512x768x3072"],
    "int8": ["512x512x512", "1024x1024x1024", "2048x2048x2048", "128x3072x768", "512x768x3072"],
    # 1x32768x16384 packs to 336 MB, more than the 300 MB L3: DRAM bandwidth, honestly.
    "int4": ["1x4096x4096", "4x4096x4096", "8x4096x4096", "1x11008x4096", "1x32768x16384",
             "8x32768x16384"],
    "fp4": ["1x4096x4096", "8x4096x4096"],
    "fp8": ["1x4096x4096", "8x4096x4096"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="bf16", choices=sorted(SUITES),
                        help="bf16 and int8 GEMMs; int4/fp4/fp8 weight-only GEMV (group 32)")
    parser.add_argument("--shape", action="append", default=[], metavar="MxNxK",
                        help="benchmark this shape instead of the suite (repeatable)")
    parser.add_argument("--block-seconds", type=float, default=0.15,
                        help="timed seconds per implementation per round")
    parser.add_argument("--cold", action="store_true",
                        help="GEMV: each call reads the next of several weight copies that "
                             "together exceed L3 (decoding a model larger than the cache)")


def _peers_bf16(a, b, threads):
    import torch

    torch.set_num_threads(threads)
    ta, tb = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16), \
        torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
    return {"torch": lambda: torch.matmul(ta, tb)}


def _peers_int8(a, b, threads):
    peers = {}
    try:
        import torch

        torch.set_num_threads(threads)
        ta, tb = torch.from_numpy(a.view(np.int8) ^ -128), torch.from_numpy(b)
        if a.shape[0] > 16 and a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0:
            peers["torch_int_mm"] = lambda: torch._int_mm(ta, tb)
    except ImportError:
        pass
    session = _ort_matmul_integer(b, threads)
    if session is not None:
        peers["ort"] = lambda: session.run(None, {"A": a})
    return peers


def _ort_matmul_integer(b: np.ndarray, threads: int):
    """An ONNX Runtime session for A(u8) @ B(s8, a constant initializer), or None."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    k, n = b.shape
    node = helper.make_node("MatMulInteger", ["A", "B"], ["Y"])
    graph = helper.make_graph(
        [node], "mmi", [helper.make_tensor_value_info("A", TensorProto.UINT8, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["M", n])],
        [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


OURS = ("tilefold", "tf_unpacked_b", "fp32")  # tilefold's contenders: the rest are peers


def _time_all(impls: dict, args, bench: Bench) -> dict[str, Timing]:
    return bench.measure(impls, lambda fn: time_block(fn, args.block_seconds), ours=OURS,
                         warm_calls=0)  # a block starts with two untimed calls


def _lead(shape: Shape) -> str:
    return f"{shape.name:<16}{shape.m:>6}{shape.n:>6}{shape.k:>6}"


LEAD_HEAD = f"{'shape':<16}{'M':>6}{'N':>6}{'K':>6}"


def _gemm_row(shape: Shape, dtype: str, threads: int, args, bench: Bench) -> Row:
    from tilefold.linalg import matmul
    from tilefold.quant import matmul_lowp, prepack_lowp

    rng = np.random.default_rng(0)
    a32 = rng.standard_normal((shape.m, shape.k), dtype=np.float32)
    b32 = rng.standard_normal((shape.k, shape.n), dtype=np.float32)
    impls = {"fp32": lambda: matmul(a32, b32, threads=threads)}
    if dtype == "bf16":
        a, b = a32.astype(ml_dtypes.bfloat16), b32.astype(ml_dtypes.bfloat16)
    else:
        a = rng.integers(0, 256, (shape.m, shape.k)).astype(np.uint8)
        b = rng.integers(-128, 128, (shape.k, shape.n)).astype(np.int8)
    packed = prepack_lowp(b, a.dtype)
    impls["tilefold"] = lambda: matmul_lowp(a, packed, threads=threads)
    impls["tf_unpacked_b"] = lambda: matmul_lowp(a, b, threads=threads)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        peers = _without_emulated(_peers_bf16 if dtype == "bf16" else _peers_int8, a, b, a32,
                                  b32, threads, shape, bench)
        timings = _time_all({**impls, **peers}, args, bench)
    return Row(shape.name, _lead(shape), timings, work=dict.fromkeys(timings, shape.flops))


# A peer this many times slower than tilefold's fp32 GEMM on a 256-cube probe runs the type in
# software (PyTorch's bf16 matmul without bf16 hardware: 1.8 GFLOP/s at 256**3, 0.2 at
# 2048**3 on Zen 1, 97 s a call); timing it every round would take the suite hours, so it is
# named in a note and left out.
EMULATED_SLOWDOWN = 10.0
PROBE = 256


def _without_emulated(make_peers: Callable, a: np.ndarray, b: np.ndarray, a32: np.ndarray,
                      b32: np.ndarray, threads: int, shape: Shape, bench: Bench) -> dict:
    from tilefold.linalg import matmul

    m, k, n = (min(PROBE, d) for d in (shape.m, shape.k, shape.n))
    small = make_peers(np.ascontiguousarray(a[:m, :k]), np.ascontiguousarray(b[:k, :n]),
                       threads)
    sa, sb = np.ascontiguousarray(a32[:m, :k]), np.ascontiguousarray(b32[:k, :n])

    def seconds(fn) -> float:
        fn()  # the first call may compile
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    fp32 = seconds(lambda: matmul(sa, sb, threads=threads))
    peers = make_peers(a, b, threads)
    for name, fn in small.items():
        spent = seconds(fn)
        if spent > EMULATED_SLOWDOWN * fp32:
            bench.note(f"{shape.name}: {name} left out: {spent / fp32:.0f}x slower than "
                       f"tilefold's fp32 GEMM at {m}x{n}x{k} ({2 * m * n * k / spent / 1e9:.1f} "
                       "GFLOP/s): the type runs in software here")
            peers.pop(name, None)
    return peers


# Above this many f32 weight bytes the fp32 peer is skipped and codes are drawn at random
# (quantizing gigabytes of floats would take longer than the benchmark).
FP32_MAX_BYTES = 1 << 30


def _random_codes(fmt: str, k: int, n: int, rng) -> QuantizedTensor:
    """A [K, N] weight of random codes and group-32 scales, built without the float matrix."""
    f = FORMATS[fmt]
    rows = k // 2 if f.bits == 4 else k
    probe = quantize(np.ones((64, 1), np.float32), fmt, group_size=32)
    data = np.frombuffer(rng.bytes(rows * n), probe.data.dtype).reshape(rows, n)
    scale = rng.uniform(0.01, 0.1, (k // 32, n)).astype(np.float32)
    return QuantizedTensor(f, (k, n), 0, data, scale)


def _copies(nbytes: int, cold: bool) -> int:
    """Weight copies a GEMV rotates through: enough to fill L3 twice when `cold`, so each call
    reads its weight from DRAM (as when decoding a model larger than the cache), else one."""
    from tilefold.target import host_target

    return max(1, math.ceil(2 * host_target().l3_bytes / nbytes)) if cold else 1


def _rotating(call, weights: list):
    """A zero-argument call applying `call` to the next weight of `weights` each time (each
    called once first: a weight's first call builds its kernel layout and plan)."""
    for w in weights:
        call(w)
    ring = itertools.cycle(weights)
    return lambda: call(next(ring))


def _gemv_row(shape: Shape, fmt: str, threads: int, args, bench: Bench) -> Row:
    """GB/s on packed bytes for the quantized weight; fp32 GEMV on its own bytes."""
    from tilefold.linalg import matmul

    rng = np.random.default_rng(0)
    x = rng.standard_normal((shape.m, shape.k), dtype=np.float32)
    impls = {}
    if shape.k * shape.n * 4 <= FP32_MAX_BYTES:
        w = rng.standard_normal((shape.k, shape.n), dtype=np.float32)
        qw = quantize(w, fmt, group_size=32)
        ws = [w] + [w.copy() for _ in range(_copies(w.nbytes, args.cold) - 1)]
        impls["fp32"] = _rotating(lambda wi: matmul(x, wi, threads=threads), ws)
    else:
        qw = _random_codes(fmt, shape.k, shape.n, rng)
    qws = [qw] + [QuantizedTensor(qw.format, qw.shape, qw.axis, qw.data.copy(), qw.scale.copy(),
                                  qw.zero_point) for _ in range(_copies(qw.nbytes, args.cold) - 1)]
    impls["tilefold"] = _rotating(lambda qi: quantized_matmul(x, qi, threads=threads), qws)
    timings = _time_all(impls, args, bench)
    return Row(shape.name, _lead(shape), timings,
               work={"tilefold": qw.nbytes, "fp32": shape.k * shape.n * 4})


def run(args: argparse.Namespace, bench: Bench) -> int:
    shapes = [parse_shape(s) for s in args.shape or SUITES[args.dtype]]
    for threads in args.thread_counts:
        if args.dtype in ("bf16", "int8"):
            bench.table(_gemm_section(shapes, threads, args, bench))
        else:
            bench.table(_gemv_section(shapes, threads, args, bench))
    return 0


def _gemm_section(shapes: list[Shape], threads: int, args, bench: Bench) -> Section:
    from tilefold.codegen.llvm.lowp.kernels import select_dot_kernel
    from tilefold.target import host_target, measured_peak_gflops
    from tilefold.target.probes import probe_kind

    kind = "bf16" if args.dtype == "bf16" else "u8s8"
    kernel = select_dot_kernel(host_target(), kind)
    vector_peak = measured_peak_gflops(dtype=args.dtype, threads=threads, refresh=True)
    peak = vector_peak
    via = probe_kind(host_target(), args.dtype).via
    peaks = f"{vector_peak:.1f} ({args.dtype} vector{f', via {via}' if via else ''})"
    if kernel.is_amx:
        peak = measured_peak_gflops(dtype=f"amx-{args.dtype}", threads=threads, refresh=True)
        peaks = f"{peak:.1f} (amx-{args.dtype} tiles, %peak below), " + peaks
    f32_peak = measured_peak_gflops(dtype="f32", threads=threads, refresh=True)
    title = (f"{args.dtype}, {threads} thread(s), micro-kernel {kernel.name}; measured peak "
             f"{peaks}, {f32_peak:.1f} (f32)")
    unit = "GFLOP/s" if args.dtype == "bf16" else "GOP/s"
    rows = [_gemm_row(s, args.dtype, threads, args, bench) for s in shapes]
    return Section(title, LEAD_HEAD, unit, rows, peak=peak, threads=threads)


def _gemv_section(shapes: list[Shape], threads: int, args, bench: Bench) -> Section:
    from tilefold.target import measured_bandwidth_gbps

    bandwidth = measured_bandwidth_gbps(threads)
    where = "from DRAM (weights rotate past L3)" if args.cold else "hot (one weight, may be cached)"
    title = (f"{args.dtype} weight-only GEMV (group 32), {threads} thread(s), weights {where}; "
             f"measured read bandwidth {bandwidth:.1f} GB/s; tilefold's GB/s counted on packed "
             "bytes (codes + scales), fp32's on its own")
    rows = [_gemv_row(s, args.dtype, threads, args, bench) for s in shapes]
    return Section(title, LEAD_HEAD, "GB/s", rows, peak=bandwidth, threads=threads)


SUITE = Suite("lowp", __doc__, add_arguments, run, rounds=3, threads="all", multi_threads=True)
