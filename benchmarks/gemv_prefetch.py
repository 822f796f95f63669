"""The f32 GEMV's prefetch distance on a model's decode GEMVs, replayed: GB/s per shape.

For each shape of a decoded token (qkv, o, gate_up, down: one weight per layer; the head) and
for the whole token (the layers' GEMVs interleaved as a model runs them, then the head), the
calls are one `Replay` (one native call, as a replayed decode step makes them), on weights in
PyTorch's [N, K] layout (the dot form, read in place). Every prefetch distance given is a
separate replay of the same weights, and the distances are timed in turn within each
repetition, so a busy host slows them alike: compare the columns of one run, not runs.
Figures: best / median GB/s. A group of weights that fits the L3 (SmolLM2's o) reads
partly from it across repetitions: the head and the token are the ones past it.

Run alone: `flock -x /tmp/tf-cpu.lock python benchmarks/gemv_prefetch.py [--ahead 256,1024]
[--threads 2] [--model qwen0.5b]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tilefold.codegen.llvm.gemm.gemv import GemvMode
from tilefold.codegen.llvm.gemm.gemv_config import GemvConfig
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import GemvPlan
from tilefold.runtime.replay import Replay

# Per model: (name, N, K) per layer, the head, the layer count.
MODELS = {
    "smollm2": ((("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576),
                 ("down", 576, 1536)), ("head", 49152, 576), 30),
    "qwen0.5b": ((("qkv", 1152, 896), ("o", 896, 896), ("gate_up", 9728, 896),
                  ("down", 896, 4864)), ("head", 151936, 896), 24),
}


def groups(model: str) -> dict[str, list[tuple[int, int]]]:
    """(N, K) of each GEMV a group replays: each shape once a layer, the head twice, a token."""
    layer, (_, *head), layers = MODELS[model]
    out = {name: [(n, k)] * layers for name, n, k in layer}
    out["head"] = [tuple(head)] * 2
    out["token"] = [(n, k) for _ in range(layers) for _, n, k in layer] + [tuple(head)]
    return out


def replays(shapes, aheads, threads, rng) -> tuple[int, list[Replay], list]:
    """The group's bytes of weights, a replay per prefetch distance (same weights), and what
    the replays point into."""
    module = gemm_module()
    operands = [(rng.standard_normal((n, k), dtype=np.float32),
                 rng.standard_normal((1, k), dtype=np.float32), np.empty((1, n), np.float32))
                for n, k in shapes]
    out, plans = [], []
    for ahead in aheads:
        calls = []
        for w, x, y in operands:
            plan = GemvPlan(module, w.shape[0], w.shape[1], w.shape[1], 1, 1, 0, threads,
                            GemvMode.DOT, False, GemvConfig(ahead=ahead // 4))
            calls.append(plan.call(x, w, y))
            plans.append(plan)
        out.append(Replay(calls))
    return sum(w.nbytes for w, _, _ in operands), out, [operands, plans]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ahead", default="256,1024", help="prefetch distances in bytes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    aheads = [int(a) for a in args.ahead.split(",")]
    rng = np.random.default_rng(0)
    print(f"{args.model}, {args.threads} thread(s); GB/s best/median at prefetch "
          + ", ".join(f"{a} B" for a in aheads))
    for name, shapes in groups(args.model).items():
        nbytes, reps, _keep = replays(shapes, aheads, args.threads, rng)
        times: list[list[float]] = [[] for _ in reps]
        for rep in reps:
            rep()
        for _ in range(args.repeats):
            for rep, samples in zip(reps, times, strict=True):
                start = time.perf_counter()
                rep()
                samples.append(time.perf_counter() - start)
        cells = [f"{nbytes / min(t) / 1e9:5.1f}/{nbytes / statistics.median(t) / 1e9:5.1f}"
                 for t in times]
        print(f"{name:8s} {nbytes / 2**20:6.0f} MiB  " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()
