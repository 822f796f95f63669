"""softmax, layer_norm and rms_norm: tilefold's generated kernels vs NumPy, PyTorch eager and
torch.compile, in one run (interleaved medians after warm-up), in GB/s and % of the measured
memory bandwidth. Run alone: `flock /tmp/tilefold-bench.lock python benchmarks/memory_bound.py`
(`--no-torch-compile` skips inductor, `--quick` uses fewer repeats)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from tilefold.codegen.kernel import compile_group
from tilefold.ir import functional as F
from tilefold.ir import trace
from tilefold.runtime import num_threads
from tilefold.target import host_target, measured_bandwidth_gbps

try:
    import torch
except ImportError:  # the PyTorch columns are left empty
    torch = None


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


def _torch_ops():
    return {
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5),
        "rms_norm": lambda x, w: torch.nn.functional.rms_norm(x, x.shape[-1:], w, 1e-6),
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
    x = ("x", "f32", shape)
    w = ("w", "f32", shape[-1:])
    if op == "softmax":
        return trace(lambda v: F.softmax(v, axis=-1), x)
    if op == "layer_norm":
        return trace(lambda v, a, c: F.layer_norm(v, a, c, eps=1e-5), x, w, ("b", "f32", w[2]))
    return trace(lambda v, a: F.rms_norm(v, a, eps=1e-6), x, w)


def interleaved_medians(fns: dict[str, Callable], args: dict[str, tuple], seconds: float):
    """Warm up, then time the candidates in turn (batches of >= 2 ms) until `seconds` pass."""
    batch = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn(*args[name])
        t0 = time.perf_counter()
        fn(*args[name])
        batch[name] = max(1, int(2e-3 / max(time.perf_counter() - t0, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or min(len(s) for s in samples.values()) < 5:
        for name, fn in fns.items():
            a = args[name]
            t0 = time.perf_counter()
            for _ in range(batch[name]):
                fn(*a)
            samples[name].append((time.perf_counter() - t0) / batch[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    target = host_target()
    threads = num_threads()
    bandwidth = measured_bandwidth_gbps(threads)
    big_rows = min(int(1.25 * target.l3_bytes) // (2048 * 4), 65536)
    if torch is not None:
        torch.set_num_threads(threads)
    print(f"# {target}, {threads} threads, L2 {target.l2_bytes >> 20} MiB/core, "
          f"L3 {target.l3_bytes >> 20} MiB; measured read bandwidth {bandwidth:.1f} GB/s")
    print("| op | shape | MiB in | tilefold GB/s | % of bw | vs NumPy | vs eager | "
          "vs torch.compile |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for op, shape in cases(big_rows):
        x = rng.standard_normal(shape, dtype=np.float32)
        params = {"softmax": 0, "layer_norm": 2, "rms_norm": 1}[op]
        inputs = (x, *(rng.standard_normal(shape[-1:], dtype=np.float32) for _ in range(params)))
        tf = compile_group(_group(op, shape)["main"])
        fns: dict[str, Callable] = {"tilefold": tf,
                                    "numpy": {"softmax": _np_softmax, "layer_norm": _np_layer_norm,
                                              "rms_norm": _np_rms_norm}[op]}
        args = {"tilefold": inputs, "numpy": inputs}
        if torch is not None:
            targs = tuple(torch.from_numpy(a) for a in inputs)
            fns["eager"] = _torch_ops()[op]
            args["eager"] = targs
            if not opts.no_torch_compile:
                fns["compile"] = torch.compile(_torch_ops()[op], dynamic=False)
                args["compile"] = targs
        np.testing.assert_allclose(tf(*inputs)[0], fns["numpy"](*inputs), rtol=1e-4, atol=1e-5)
        t = interleaved_medians(fns, args, 1.0 if opts.quick else 4.0)
        nbytes = 2 * x.nbytes + sum(a.nbytes for a in inputs[1:])
        gbps = nbytes / t["tilefold"] / 1e9

        ratios = [f"{t[n] / t['tilefold']:.2f}x" if n in t else "-"
                  for n in ("numpy", "eager", "compile")]
        print(f"| {op} | {'x'.join(map(str, shape))} | {x.nbytes / 2**20:.0f} | {gbps:.1f} | "
              f"{100 * gbps / bandwidth:.0f}% | {' | '.join(ratios)} |", flush=True)
    tiny = np.ones((1, 16), np.float32)
    tf = compile_group(_group("softmax", (1, 16))["main"])
    overhead = {"tilefold": tf, "numpy": _np_softmax}
    oargs = {"tilefold": (tiny,), "numpy": (tiny,)}
    if torch is not None:
        overhead["eager"] = _torch_ops()["softmax"]
        oargs["eager"] = (torch.from_numpy(tiny),)
    t = interleaved_medians(overhead, oargs, 1.0)
    print("\ncall overhead, softmax 1x16: " +
          ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in t.items()))


if __name__ == "__main__":
    main()
