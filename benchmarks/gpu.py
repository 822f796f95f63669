"""tilefold's GPU kernels on one GPU against cuBLAS, PyTorch eager, torch.compile and SDPA.

    python benchmarks/gpu.py OUT_DIR            # on a CUDA machine (see benchmarks/gpu.sh)
    python benchmarks/gpu.py OUT_DIR --smoke    # tiny shapes on the CPU, Triton's interpreter

Each case checks tilefold's result against PyTorch's first (relative error over the largest
magnitude), then times every contender with `triton.testing.do_bench` (medians of its repeats;
`--smoke` uses perf_counter). GEMM configs are chosen by tilefold's own tuner
(`strategy.gpu_tuner`, with this script's timer): "tilefold" is the best template config it
measured, "chosen" the winner with cuBLAS raced beside the templates (a warm tuning database
measures nothing again). Results go to OUT_DIR/gpu.md (a table) and OUT_DIR/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter)")
    p.add_argument("--configs", type=int, default=4, help="GEMM configs proposed per shape")
    p.add_argument("--tune-budget", type=float, default=20.0,
                   help="seconds tilefold's tuner may spend measuring one GEMM shape")
    p.add_argument("--no-max-autotune", action="store_true",
                   help="skip torch.compile(mode='max-autotune-no-cudagraphs') (slow to compile)")
    return p.parse_args()


def main() -> int:
    args = _args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from tilefold.codegen.triton.attention import TritonAttention
    from tilefold.codegen.triton.gemm_launch import TritonGemm
    from tilefold.strategy.gpu_tuner import EXTERN_GEMM, GPUTuner, gemm_candidates
    from tilefold.target import detect_gpu, gpu_target

    device = "cpu" if args.smoke else "cuda"
    target = gpu_target("h200") if args.smoke else (detect_gpu() or gpu_target("h100"))
    dtype = torch.float32 if args.smoke else torch.bfloat16
    name = "f32" if args.smoke else "bf16"

    def bench(fn) -> float:
        if args.smoke:
            fn()
            start = time.perf_counter()
            for _ in range(3):
                fn()
            return (time.perf_counter() - start) / 3 * 1e3
        from triton.testing import do_bench
        return do_bench(fn, warmup=25, rep=100)

    def compiled(fn, mode: str | None):
        return torch.compile(fn, mode=mode, dynamic=False)

    rows: list[dict] = []

    def record(case: str, flops: float, want, got, timings: dict[str, float]) -> None:
        err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        rows.append({"case": case, "max_rel_err": err, "ms": timings,
                     "tflops": {k: flops / v / 1e9 for k, v in timings.items()}})
        print(case, f"err {err:.1e}", {k: f"{v:.3f} ms" for k, v in timings.items()}, flush=True)

    tuner = GPUTuner(target, timer=bench, budget=args.tune_budget)

    def gemm_case(m: int, n: int, k: int, layout: str) -> None:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        if layout == "NT":
            b = torch.randn(n, k, device=device, dtype=dtype).t()
        gemms = {"none": TritonGemm(name, name)}

        def template(config):
            split = "none" if config.split_k == 1 else "workspace"
            if split not in gemms:
                gemms[split] = TritonGemm(name, name, split=split)
            return lambda ts, gemm=gemms[split]: gemm(*ts, config=config)

        candidates = gemm_candidates(target, (m, n, k), name, template,
                                     lambda ts: [torch.matmul(*ts)], limit=args.configs)
        choice = tuner.choose(f"benchmarks/gpu.py gemm {name}", [a, b], candidates)
        measured = {key: ms for key, ms in choice.timings.items() if key != EXTERN_GEMM}
        best = min(measured, key=measured.get)
        timings = {"tilefold": measured[best], "chosen": choice.timings[choice.key],
                   "cublas": bench(lambda: torch.matmul(a, b))}
        if not args.smoke:
            mm = compiled(torch.matmul, None)
            timings["compile"] = bench(lambda: mm(a, b))
            if not args.no_max_autotune and (m, n, k) == shapes[0]:
                mx = compiled(torch.matmul, "max-autotune-no-cudagraphs")
                timings["max-autotune"] = bench(lambda: mx(a, b))
        template_run = next(c for c in candidates if c.key == best).build()  # checked, not cuBLAS
        record(f"gemm {name} {m}x{n}x{k} {layout} [{best.removeprefix('triton.gemm')}]",
               2 * m * n * k, torch.matmul(a, b), template_run([a, b])[0], timings)

    def attention_case(bsz: int, heads: int, seq: int, dim: int) -> None:
        q, k, v = (torch.randn(bsz, heads, seq, dim, device=device, dtype=dtype)
                   for _ in range(3))
        att = TritonAttention(name, causal=True)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        timings = {"tilefold": bench(lambda: att(q, k, v)),
                   "sdpa": bench(lambda: sdpa(q, k, v, is_causal=True))}
        flops = 2 * bsz * heads * seq * seq * dim  # two products, half the scores (causal)
        record(f"attention causal {bsz}x{heads}x{seq}x{dim}", flops,
               sdpa(q, k, v, is_causal=True), att(q, k, v), timings)

    shapes = [(64, 48, 80), (33, 64, 100)] if args.smoke else [
        (4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 4096), (8192, 8192, 16384)]
    for m, n, k in shapes:
        for layout in ("NN", "NT"):
            gemm_case(m, n, k, layout)
    for shape in [(1, 2, 16, 16)] if args.smoke else [(4, 32, 2048, 128), (1, 32, 8192, 128)]:
        attention_case(*shape)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(
        {"device": str(target.name), "torch": torch.__version__, "rows": rows}, indent=1))
    names = sorted({k for r in rows for k in r["ms"]})
    lines = [f"# tilefold GPU benchmark on {target.name} (ms; tflop/s in brackets)", "",
             "| case | err | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for r in rows:
        cells = [f"{r['ms'][k]:.3f} ({r['tflops'][k]:.0f})" if k in r["ms"] else "-"
                 for k in names]
        lines.append(f"| {r['case']} | {r['max_rel_err']:.1e} | " + " | ".join(cells) + " |")
    (args.out / "gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
