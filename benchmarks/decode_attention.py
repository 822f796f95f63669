"""Decode attention: the decode kernel against the flash kernel on a static cache's decode step.

One query row per head against a cache of L positions whose bool mask keeps a prefix of
`valid` positions (as Hugging Face's static cache does), grouped-query heads read from the
cache as it lies. Each call is timed on its own raw ctypes entry (no Python wrapper). "hot"
repeats one layer's cache (it stays in L2/L3); "cycled" walks the caches of enough layers to
exceed the last-level cache, as a model's decode step does. GB/s counts the valid K and V bytes.

Run alone on the machine: `flock -x /tmp/tf-cpu.lock python benchmarks/decode_attention.py`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from tilefold.codegen.llvm.attention import AttentionConfig, DecodeConfig, attention_kernel
from tilefold.target import host_target

SHAPES = [  # heads, kv heads, head dim, cache length
    (9, 3, 64, 512), (9, 3, 64, 2048), (32, 8, 128, 2048)]


def _time(fn, seconds: float) -> float:
    """Median seconds per call over samples of batches lasting about 1 ms each."""
    fn()
    start = time.perf_counter()
    fn()
    batch = max(1, int(1e-3 / max(time.perf_counter() - start, 1e-7)))
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(samples) < 5:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seconds", type=float, default=0.3, help="per measurement")
    p.add_argument("--llc-mb", type=float, default=64, help="bytes the cycled caches span")
    args = p.parse_args()
    target = host_target()
    lanes = target.vector_bits // 32
    print(f"host {target.name}, {lanes} lanes; times per call in microseconds")
    print(f"{'H/Hk/D':>10} {'L':>5} {'valid':>5} {'thr':>3} {'mode':>6} "
          f"{'decode':>8} {'flash':>8} {'ratio':>6} {'GB/s':>6}")
    rng = np.random.default_rng(0)
    for h, hk, d, length in SHAPES:
        kv_bytes = 2 * hk * length * d * 4
        layers = max(1, math.ceil(args.llc_mb * 2**20 / kv_bytes))
        caches = [(rng.standard_normal((1, hk, length, d), np.float32),
                   rng.standard_normal((1, hk, length, d), np.float32)) for _ in range(layers)]
        q = rng.standard_normal((1, h, 1, d), np.float32)
        out = np.empty((1, h, 1, d), np.float32)
        for valid in sorted({64, length // 4, length // 2, length}):
            mask = np.zeros((1, 1, 1, length), bool)
            mask[..., :valid] = True
            for threads in args.threads:
                kernels = {
                    "decode": attention_kernel(DecodeConfig(
                        d, d, "bool", False, lanes, threads, target.vector_registers), target),
                    "flash": attention_kernel(AttentionConfig(
                        d, d, "bool", False, lanes, threads, target.vector_registers), target)}
                for mode, used in (("hot", caches[:1]), ("cycled", caches)):
                    times = {}
                    for name, kernel in kernels.items():
                        fn = kernel._fn  # the native entry: what a replayed step calls
                        calls = [(q, k, v, mask, out, 1 / math.sqrt(d)) for k, v in used]
                        state = {"i": 0}

                        def call(fn=fn, calls=calls, state=state) -> None:
                            fn(*calls[state["i"]])
                            state["i"] = (state["i"] + 1) % len(calls)

                        times[name] = _time(call, args.seconds)
                    gbps = 2 * hk * valid * d * 4 / times["decode"] / 1e9
                    print(f"{f'{h}/{hk}/{d}':>10} {length:>5} {valid:>5} {threads:>3} "
                          f"{mode:>6} {times['decode'] * 1e6:>8.2f} {times['flash'] * 1e6:>8.2f} "
                          f"{times['flash'] / times['decode']:>6.2f} {gbps:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
