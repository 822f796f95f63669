"""One new process of `tilefold bench aot`: load one artifact, run it once, then a few more
times, and print one JSON line: seconds from the parent's start of this process to the first
result, the median of the later calls, and the peak RSS.

`python -m tilefold.cli.aot_start KIND PATH START_NS THREADS RUNS INPUT.npy ...`, KIND one of
`LOADERS`; START_NS the parent's `time.time_ns()` just before it started this process (so the
interpreter's own start counts). Only what KIND's loader needs is imported: the tilefold
artifact's run imports NumPy and tilefold's loader, never torch.
"""

from __future__ import annotations

import time

START = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable


def _tilefold(path: str, threads: int, arrays: list) -> Callable[[], Any]:
    os.environ["TILEFOLD_NUM_THREADS"] = str(threads)
    import tilefold

    model = tilefold.load(path)
    return lambda: model(*arrays)


def _aoti(path: str, threads: int, arrays: list) -> Callable[[], Any]:
    import torch

    torch.set_num_threads(threads)
    runner = torch._inductor.aoti_load_package(path)
    tensors = [torch.from_numpy(a) for a in arrays]
    return lambda: runner(*tensors)


def _ort(path: str, threads: int, arrays: list) -> Callable[[], Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = dict(zip(names, arrays, strict=False))  # the exporter may drop an unused input
    return lambda: session.run(None, feed)


def peak_rss() -> int:
    """This process's peak resident bytes since it started its program (`VmHWM`: getrusage's
    maxrss would count the parent's, which a child inherits across exec on Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


LOADERS: dict[str, Callable[[str, int, list], Callable[[], Any]]] = {
    "tilefold": _tilefold, "aoti": _aoti, "ort": _ort}


def main(argv: list[str]) -> None:
    kind, path, start_ns, threads, runs, *inputs = argv
    import numpy as np

    arrays = [np.load(p) for p in inputs]
    call = LOADERS[kind](path, int(threads), arrays)
    call()
    done = time.time()
    first, in_process = done - int(start_ns) / 1e9, done - START
    times = []
    for _ in range(int(runs)):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    peak = peak_rss()
    import json  # the report's only: after the first result, whose time is the loader's
    import statistics

    print(json.dumps({"first_result_s": first, "in_process_s": in_process,
                      "steady_s": statistics.median(times) if times else 0.0,
                      "peak_rss_bytes": peak}))


if __name__ == "__main__":
    main(sys.argv[1:])
