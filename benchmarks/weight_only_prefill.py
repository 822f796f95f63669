"""Weight-only matmuls for a prompt (M rows) on a model's shapes (`--model`, default SmolLM2-135M):
GFLOP/s of the int4/int8 path (the weight decoded into f32 GEMM panels, then the f32 GEMM)
beside the f32 GEMM on a pre-packed f32 weight, and (where the host has VNNI) the integer-dot
kernel on int8 activations ("-q8"); native calls.

Run alone: `flock -x /tmp/tf-cpu.lock python benchmarks/weight_only_prefill.py [--m 256]`.
"""

from __future__ import annotations

import argparse

import numpy as np
from weight_only_gemv import MODELS, per_call

from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.prepack import PackedMatrix
from tilefold.codegen.llvm.lowp import weight_only as wo
from tilefold.quant import quantize
from tilefold.target import host_target


class Runner:
    def __init__(self, run):
        self.run = run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=256)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--formats", default="int4,int8")
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    args = p.parse_args()
    layer, head, _ = MODELS[args.model]
    rng = np.random.default_rng(0)
    module = gemm_module(host_target())
    for threads in (int(t) for t in args.threads.split(",")):
        print(f"== {threads} thread(s), M = {args.m}: GFLOP/s  (f32 GEMM on a pre-packed "
              "f32 weight | weight-only, decoded into panels each call)")
        for name, k, n in (*layer, head):
            w = rng.standard_normal((k, n)).astype(np.float32)
            x = rng.standard_normal((args.m, k)).astype(np.float32)
            y = np.empty((args.m, n), np.float32)
            packed = PackedMatrix(w, module)
            plan = make_plan(module, x, packed, y, 0, threads)
            runs = {"f32": Runner(lambda plan=plan, b=packed.data, x=x, y=y: plan(x, b, y))}
            for fmt in args.formats.split(","):
                qt = quantize(w, fmt, group_size=32)
                call = wo.prepare(qt, args.m, k, threads=threads)
                runs[fmt] = Runner(lambda call=call, x=x, y=y: call.run(x, y))
                if wo.dot_refusal(wo.stream_layout(qt, host_target()), host_target()) is None:
                    dot = wo.prepare(qt, args.m, k, threads=threads, dot=True)
                    runs[f"{fmt}-q8"] = Runner(lambda call=dot, x=x, y=y: call.run(x, y))
            best = {key: min(per_call([r], args.seconds) for _ in range(3))
                    for key, r in runs.items()}
            flops = 2 * args.m * k * n
            cells = "  ".join(f"{key} {flops / t / 1e9:6.1f}" for key, t in best.items())
            print(f"{name:>8} {k:>5}x{n:<6} {cells}")


if __name__ == "__main__":
    main()
