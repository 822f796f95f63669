"""Weight-only GEMV on a model's shapes: GB/s per call, hot and cold, and a token's sequence.

Times the kernels' native calls (`NativePlan.run`, what a replayed plan makes), not the Python
wrapper. "hot": one weight called again and again (in L2/L3); "cold": a ring of copies larger
than twice L3; "token": the 121 GEMVs of one decoded token with every layer's own weights
(30 x qkv, o, gate_up, down, then lm_head), as a model reads them. `--model` picks the shapes:
SmolLM2-135M (default; fits L3 in int4) or Qwen2.5-0.5B (`qwen0.5b`: 24 layers, a tied head of
151936 x 896, larger than L3 in every format). Format `f32` times the f32
GEMV on a weight in PyTorch's [N, K] layout, read in place (what a decode step's f32 GEMMs run).

Run alone: `flock -x /tmp/tf-cpu.lock python benchmarks/weight_only_gemv.py [--formats int4,q4_0]
[--model qwen0.5b] [--no-token]`.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from tilefold.codegen.llvm.lowp import weight_only as wo
from tilefold.quant import FORMATS, QuantizedTensor
from tilefold.target import host_target

# Per model: (name, K, N) per layer, the head, the layer count.
MODELS = {
    "smollm2": ((("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072),
                 ("down", 1536, 576)), ("lm_head", 576, 49152), 30),
    "qwen0.5b": ((("qkv", 896, 1152), ("o", 896, 896), ("gate_up", 896, 9728),
                  ("down", 4864, 896)), ("lm_head", 896, 151936), 24),
}
HUGE = False
DOT = False  # int8 activations and the integer dot product (`--dot`, the int8-act kernels)


def huge_copy(a: np.ndarray) -> np.ndarray:
    """`a` copied into 2 MiB-aligned memory advised to use transparent huge pages."""
    import ctypes
    import mmap

    size = -(-a.nbytes // (2 << 20)) * (2 << 20)
    buf = mmap.mmap(-1, size + (2 << 20))
    raw = np.frombuffer(buf, np.uint8)
    start = -raw.ctypes.data % (2 << 20)
    libc = ctypes.CDLL(None)
    libc.madvise(ctypes.c_void_p(raw.ctypes.data + start), ctypes.c_size_t(size), 14)
    out = raw[start:start + a.nbytes]
    out[...] = a
    return out


def random_weight(fmt: str, k: int, n: int, rng, zero_point: bool = False) -> QuantizedTensor:
    """A [K, N] weight of random codes, group-32 scales (and zero points), without floats."""
    f = FORMATS[fmt]
    rows = k // 2 if f.bits == 4 else k
    data = np.frombuffer(rng.bytes(rows * n), np.uint8 if f.bits == 4 else f.code.np_dtype)
    scale = rng.uniform(0.01, 0.1, (k // 32, n)).astype(np.float32)
    zp = None
    if zero_point:
        code = f.asymmetric_code
        lo, hi = (-8, 8) if f.bits == 4 else (0, 256)
        zp = rng.integers(lo, hi, scale.shape).astype(code.np_dtype)
    return QuantizedTensor(f, (k, n), 0, data.reshape(rows, n).copy(), scale, zp)


class F32Call:
    """The f32 GEMV plan of x[M, K] @ W[N, K].T for one random weight, W read in place."""

    def __init__(self, k: int, n: int, m: int, threads: int, rng):
        from tilefold.codegen.llvm.gemm.module import gemm_module
        from tilefold.codegen.llvm.gemm.plan import make_plan

        w = rng.standard_normal((n, k), dtype=np.float32)
        x = rng.standard_normal((m, k), dtype=np.float32)
        y = np.empty((m, n), np.float32)
        plan = make_plan(gemm_module(), x, w.T, y, 0, threads)
        self.run = lambda: plan(x, w.T, y)
        self.nbytes = w.nbytes


def make_call(fmt: str, k: int, n: int, m: int, threads: int, rng, zero_point: bool):
    """The call of one random weight of `fmt` ("f32" or a quantized format)."""
    if fmt == "f32":
        return F32Call(k, n, m, threads, rng)
    return Call(random_weight(fmt, k, n, rng, zero_point), m, threads, rng, DOT)


class Call:
    """The native call of one weight for M rows: x, y, the call and the bytes it streams."""

    def __init__(self, qt: QuantizedTensor, m: int, threads: int, rng, dot: bool = False):
        k = qt.shape[0]
        x = rng.standard_normal((m, k), dtype=np.float32)
        call = wo.prepare(qt, m, k, threads=threads, dot=dot)
        if HUGE:
            call.data = huge_copy(call.data)
        y = np.empty((m, qt.shape[1]), np.float32)
        self.call = call
        self.run = lambda: call.run(x, y)
        self.nbytes = call.data.nbytes


def per_call(calls: list[Call], seconds: float) -> float:
    """Seconds per call, cycling through `calls` (best of 5 blocks)."""
    runs = [c.run for c in calls]
    for r in runs:
        r()
    reps = 1
    while True:
        start = time.perf_counter()
        for _ in range(reps):
            for r in runs:
                r()
        spent = time.perf_counter() - start
        if spent > seconds / 5:
            break
        reps *= 2
    best = spent
    for _ in range(4):
        start = time.perf_counter()
        for _ in range(reps):
            for r in runs:
                r()
        best = min(best, time.perf_counter() - start)
    return best / (reps * len(runs))


def fresh_bandwidth(threads: int) -> float:
    """The memory probe's read bandwidth (`tilefold bench memory`'s forms), measured now: the
    stored figure is the best ever seen, and this shared host's bandwidth varies."""
    from tilefold.target.peaks import READ_FORMS, _read_rate

    data = np.ones((256 << 20) // 4, np.float32)
    return max(_read_rate(host_target(), data, threads, *form) for form in READ_FORMS) / 1e9


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--formats", default="int4,int8", help="f32, int4, int8, q4_0, ...")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--zero-point", action="store_true")
    p.add_argument("--huge", action="store_true")
    p.add_argument("--dot", action="store_true",
                   help="int8 activations and the integer dot product (VNNI/maddubs kernels)")
    p.add_argument("--shapes", default="qkv,o,gate_up,down,lm_head")
    p.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    p.add_argument("--no-token", action="store_true", help="skip the token's sequence")
    args = p.parse_args()
    global HUGE, DOT
    HUGE, DOT = args.huge, args.dot
    layer, head, layers = MODELS[args.model]
    rng = np.random.default_rng(0)
    l3 = host_target().l3_bytes
    for threads in (int(t) for t in args.threads.split(",")):
        bw = fresh_bandwidth(threads)
        print(f"== {threads} thread(s), probe {bw:.1f} GB/s, M = {args.m}")
        for fmt in args.formats.split(","):
            print(f"-- {fmt}: shape  KxN   bytes  hot us GB/s %  |  cold us GB/s %")
            for name, k, n in (*layer, head):
                if name not in args.shapes.split(","):
                    continue
                one = make_call(fmt, k, n, args.m, threads, rng, args.zero_point)
                copies = max(2, math.ceil(2 * l3 / one.nbytes))
                ring = [one] + [make_call(fmt, k, n, args.m, threads, rng, args.zero_point)
                                for _ in range(copies - 1)]
                hot = per_call([one], args.seconds)
                cold = per_call(ring, args.seconds)
                nb = one.nbytes
                print(f"{name:>8} {k:>5}x{n:<6}{nb / 1e6:7.2f}MB "
                      f"{hot * 1e6:8.1f} {nb / hot / 1e9:5.1f} {100 * nb / hot / 1e9 / bw:3.0f}%"
                      f"  | {cold * 1e6:8.1f} {nb / cold / 1e9:5.1f} "
                      f"{100 * nb / cold / 1e9 / bw:3.0f}%")
                del ring
            if args.no_token:
                continue
            token = [make_call(fmt, k, n, args.m, threads, rng, args.zero_point)
                     for _ in range(layers) for _, k, n in layer]
            token.append(make_call(fmt, *head[1:], args.m, threads, rng, args.zero_point))
            t = per_call(token, args.seconds * 4) * len(token)
            nb = sum(c.nbytes for c in token)
            print(f"   token: {len(token)} calls, {nb / 1e6:.1f} MB, {t * 1e3:.2f} ms, "
                  f"{nb / t / 1e9:.1f} GB/s ({100 * nb / t / 1e9 / bw:.0f}% of the probe)")
            del token


if __name__ == "__main__":
    main()
