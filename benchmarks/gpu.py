"""tilefold's GPU kernels on one GPU against cuBLAS, PyTorch eager, torch.compile and SDPA.

    python benchmarks/gpu.py OUT_DIR            # on a CUDA machine (see benchmarks/gpu.sh)
    python benchmarks/gpu.py OUT_DIR --smoke    # tiny shapes on the CPU, Triton's interpreter

Each case checks tilefold's result against PyTorch's first (relative error over the largest
magnitude), then times every contender with `triton.testing.do_bench` (medians of its repeats;
`--smoke` uses perf_counter). Cases: GEMMs (bf16, NN and NT) and an fp8 e4m3 GEMM with
row-wise scales against `torch._scaled_mm`, their configs (with the persistent TMA twin on
sm_90) chosen by tilefold's own tuner (`strategy.gpu_tuner`, with this script's timer:
"tilefold" is the best template config it measured, "chosen" the winner with the extern
raced beside the templates; a warm tuning
database measures nothing again); memory-bound groups (softmax, layer_norm, rms_norm) through
`tilefold.compile(module, target)` against eager and torch.compile, rated in TB/s of the bytes
they must move; a SwiGLU MLP through `torch.compile(backend="tilefold")` (the GPU path on CUDA
tensors; on the CPU path under --smoke) against eager and torch.compile; causal attention,
its configs chosen by the same tuner, against SDPA. Results go to OUT_DIR/gpu.md (a table)
and OUT_DIR/gpu.json, rewritten after every case, so a run cut short by gpu.sh's time cap
keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


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


class Run:
    """The device, dtype, timer and results one run shares between its cases."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from tilefold.strategy.gpu_tuner import GPUTuner
        from tilefold.target import detect_gpu, gpu_target

        self.args, self.torch, self.smoke = args, torch, args.smoke
        self.device = "cpu" if self.smoke else "cuda"
        self.target = gpu_target("h200") if self.smoke else (detect_gpu() or gpu_target("h100"))
        self.dtype = torch.float32 if self.smoke else torch.bfloat16
        self.name = "f32" if self.smoke else "bf16"
        self.tuner = GPUTuner(self.target, timer=self.bench, budget=args.tune_budget)
        self.rows: list[dict] = []

    def bench(self, fn) -> float:
        """Milliseconds a call of `fn` takes."""
        if self.smoke:
            fn()
            start = time.perf_counter()
            for _ in range(3):
                fn()
            return (time.perf_counter() - start) / 3 * 1e3
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100)

    def compiled(self, fn, mode: str | None = None):
        return self.torch.compile(fn, mode=mode, dynamic=False)

    def randn(self, *shape: int, dtype: Any = None) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=dtype or self.dtype)

    def record(self, case: str, work: float, unit: str, want, got, timings: dict[str, float]
               ) -> None:
        """One row: `work` is flops (unit "tflop/s") or bytes moved ("TB/s")."""
        err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        self.rows.append({"case": case, "max_rel_err": err, "ms": timings, "unit": unit,
                          "rate": {k: work / v / 1e9 for k, v in timings.items()}})
        print(case, f"err {err:.1e}", {k: f"{v:.3f} ms" for k, v in timings.items()}, flush=True)
        self.write()

    def write(self) -> None:
        out = self.args.out
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu.json").write_text(json.dumps(
            {"device": str(self.target.name), "torch": self.torch.__version__,
             "rows": self.rows}, indent=1))
        names = sorted({k for r in self.rows for k in r["ms"]})
        lines = [f"# tilefold GPU benchmark on {self.target.name} (ms; in brackets tflop/s, "
                 "or TB/s for memory-bound cases)", "",
                 "| case | err | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
        for r in self.rows:
            digits = 2 if r["unit"] == "TB/s" else 0
            cells = [f"{r['ms'][k]:.3f} ({r['rate'][k]:.{digits}f})" if k in r["ms"] else "-"
                     for k in names]
            if "error" in r:
                cells = [f"failed: {r['error']}"] + [""] * (len(names) - 1)
            lines.append(f"| {r['case']} | {r['max_rel_err']:.1e} | " + " | ".join(cells) + " |")
        (out / "gpu.md").write_text("\n".join(lines) + "\n")


def tuned(run: Run, label: str, tensors: list, candidates: list) -> tuple[dict, str, Any]:
    """tilefold's tuner over `candidates` (template configs, then the extern) on `tensors`:
    the timings of the best template config and of the chosen candidate, the best config's
    name, and that config's runner (to check it, not the extern)."""
    choice = run.tuner.choose(f"benchmarks/gpu.py {label}", tensors, candidates)
    externs = {c.key for c in candidates if c.extern}
    measured = {key: ms for key, ms in choice.timings.items() if key not in externs}
    best = min(measured, key=measured.get)
    timings = {"tilefold": measured[best], "chosen": choice.timings[choice.key]}
    name = best.removeprefix("triton.gemm").removeprefix("triton.attention")
    return timings, name, next(c for c in candidates if c.key == best).build()


def tuned_gemm(run: Run, label: str, mnk: tuple[int, int, int], dot: str, tensors: list,
               make, extern) -> tuple[dict[str, float], str, Any]:
    """`tuned` over the GEMM template (`make(split)` -> a `TritonGemm`; tensors: A, B, then
    the epilogue's) at its proposed configs (and the persistent TMA twin when A and B suit
    descriptors), and `extern`."""
    from tilefold.strategy.gpu_tuner import gemm_candidates

    gemms: dict[str, Any] = {"none": make("none")}
    tma = gemms["none"].tma_order(*tensors[:2]) is not None

    def template(config):
        split = "none" if config.split_k == 1 else "workspace"
        if split not in gemms:
            gemms[split] = make(split)
        return lambda ts, gemm=gemms[split]: gemm(*ts[:2], epilogue_inputs=ts[2:], config=config)

    return tuned(run, label, tensors, gemm_candidates(run.target, mnk, dot, template, extern,
                                                      limit=run.args.configs, tma=tma))


def gemm_case(run: Run, m: int, n: int, k: int, layout: str, first: bool) -> None:
    from tilefold.codegen.triton.gemm_launch import TritonGemm

    torch, name = run.torch, run.name
    a = run.randn(m, k)
    b = run.randn(n, k).t() if layout == "NT" else run.randn(k, n)
    timings, best, template = tuned_gemm(
        run, f"gemm {name}", (m, n, k), name, [a, b],
        lambda split: TritonGemm(name, name, split=split), lambda ts: [torch.matmul(*ts)])
    timings["cublas"] = run.bench(lambda: torch.matmul(a, b))
    if not run.smoke:
        mm = run.compiled(torch.matmul)
        timings["compile"] = run.bench(lambda: mm(a, b))
        if not run.args.no_max_autotune and first:
            mx = run.compiled(torch.matmul, "max-autotune-no-cudagraphs")
            timings["max-autotune"] = run.bench(lambda: mx(a, b))
    run.record(f"gemm {name} {m}x{n}x{k} {layout} [{best}]", 2 * m * n * k, "tflop/s",
               torch.matmul(a, b), template([a, b])[0], timings)


def fp8_case(run: Run, m: int, n: int, k: int) -> None:
    """e4m3 A [M, K] and B [K, N] (column-major, as _scaled_mm takes it) with f32 scales per
    row of A and per column of B, applied in the template's epilogue, into bf16."""
    from tilefold.codegen.triton.gemm_group import plan_gemm
    from tilefold.codegen.triton.gemm_launch import TritonGemm
    from tilefold.ir import functional as F
    from tilefold.ir import trace

    torch = run.torch
    e4m3 = torch.float8_e4m3fn
    a = run.randn(m, k, dtype=torch.float32).to(e4m3)
    b = run.randn(n, k, dtype=torch.float32).to(e4m3).t()
    sa = torch.rand(m, 1, device=run.device) + 0.5
    sb = torch.rand(1, n, device=run.device) + 0.5
    scaled = trace(lambda x, w, s, t: F.matmul(x, w) * s * t, ("a", "f32", (m, k)),
                   ("b", "f32", (k, n)), ("sa", "f32", (m, 1)), ("sb", "f32", (1, n)))
    plan = plan_gemm(scaled["main"], {})  # the scaling epilogue as the template's row program

    def scaled_mm(ts):
        return [torch._scaled_mm(ts[0], ts[1], scale_a=ts[2], scale_b=ts[3],
                                 out_dtype=torch.bfloat16)]

    timings, best, template = tuned_gemm(
        run, "gemm fp8e4m3 row-scaled", (m, n, k), "fp8e4m3", [a, b, sa, sb],
        lambda split: TritonGemm("fp8e4m3", "fp8e4m3", epilogue=plan.program,
                                 stores=plan.stores, split=split, out_dtypes=("bf16",)),
        scaled_mm)
    timings["scaled_mm"] = run.bench(lambda: scaled_mm([a, b, sa, sb]))
    want = (a.float() @ b.float()) * sa * sb
    run.record(f"gemm fp8e4m3 row-scaled {m}x{n}x{k} [{best}]", 2 * m * n * k, "tflop/s",
               want, template([a, b, sa, sb])[0], timings)


def memory_case(run: Run, op: str, rows: int, cols: int) -> None:
    """softmax, layer_norm or rms_norm over the last axis of [rows, cols]."""
    import tilefold as tf
    from tilefold.ir import functional as F
    from tilefold.ir import trace

    torch, fn = run.torch, run.torch.nn.functional
    ir, ref, params = {  # tilefold's IR, PyTorch's op, the parameters they read after x
        "softmax": (lambda x: F.softmax(x, axis=-1), lambda x: torch.softmax(x, -1), 0),
        "layer_norm": (lambda x, g, b: F.layer_norm(x, g, b, eps=1e-5),
                       lambda x, g, b: fn.layer_norm(x, (cols,), g, b, 1e-5), 2),
        "rms_norm": (lambda x, g: F.rms_norm(x, g, eps=1e-6),
                     lambda x, g: fn.rms_norm(x, (cols,), g, 1e-6), 1),
    }[op]
    args = [run.randn(rows, cols), *(run.randn(cols) for _ in range(params))]
    module = trace(ir, ("x", run.name, (rows, cols)),
                   *((f"p{i}", run.name, (cols,)) for i in range(params)))
    graph = tf.compile(module, target=run.target, strict=True)
    timings = {"tilefold": run.bench(lambda: graph(*args)), "eager": run.bench(lambda: ref(*args))}
    if not run.smoke:
        comp = run.compiled(ref)
        timings["compile"] = run.bench(lambda: comp(*args))
    moved = 2 * args[0].numel() * args[0].element_size()  # x read once, the result written once
    run.record(f"{op} {run.name} {rows}x{cols}", moved, "TB/s", ref(*(a.float() for a in args)),
               graph(*args)[0], timings)


def swiglu(torch, d: int, ff: int):
    """down(silu(gate(x)) * up(x)), as LLaMA's MLP, without biases."""

    class SwiGLU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Linear(d, ff, bias=False)
            self.up = torch.nn.Linear(d, ff, bias=False)
            self.down = torch.nn.Linear(ff, d, bias=False)

        def forward(self, x):
            return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))

    return SwiGLU()


def mlp_case(run: Run, tokens: int, d: int, ff: int) -> None:
    from tilefold.frontend import report
    from tilefold.frontend.dynamo import register

    torch = run.torch
    register()
    model = swiglu(torch, d, ff).to(device=run.device, dtype=run.dtype).eval()
    x = run.randn(tokens, d) / 4
    with torch.no_grad():
        ours = torch.compile(model, backend="tilefold", dynamic=False)
        got = ours(x)
        graph = report.reports()[-1]
        print("tilefold ran", graph.executor, graph.methods(), flush=True)
        timings = {"tilefold": run.bench(lambda: ours(x)), "eager": run.bench(lambda: model(x))}
        if not run.smoke:
            comp = run.compiled(model)
            timings["compile"] = run.bench(lambda: comp(x))
        want = model.float()(x.float())
    run.record(f"swiglu mlp {run.name} {tokens}x{d}x{ff} [{graph.executor}]",
               6 * tokens * d * ff, "tflop/s", want, got, timings)


def attention_case(run: Run, bsz: int, heads: int, seq: int, dim: int) -> None:
    from tilefold.codegen.triton.attention import TritonAttention
    from tilefold.strategy.gpu_tuner import attention_candidates

    q, k, v = (run.randn(bsz, heads, seq, dim) for _ in range(3))
    att = TritonAttention(run.name, causal=True)
    sdpa = run.torch.nn.functional.scaled_dot_product_attention
    candidates = attention_candidates(
        run.target, q, k, run.name, lambda c: lambda ts: [att(*ts, **c.launch())],
        lambda ts: [sdpa(*ts, is_causal=True)], limit=run.args.configs)
    timings, best, template = tuned(run, f"attention causal {run.name}", [q, k, v], candidates)
    timings["sdpa"] = run.bench(lambda: sdpa(q, k, v, is_causal=True))
    flops = 2 * bsz * heads * seq * seq * dim  # two products, half the scores (causal)
    run.record(f"attention causal {bsz}x{heads}x{seq}x{dim} [{best}]", flops, "tflop/s",
               sdpa(q, k, v, is_causal=True), template([q, k, v])[0], timings)


def main() -> int:
    args = _args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    else:  # the MLP's groups through torch.compile are tuned too (seconds a problem)
        os.environ.setdefault("TILEFOLD_TUNE", "10")
    run = Run(args)
    smoke = args.smoke
    shapes = [(64, 48, 80), (33, 64, 100)] if smoke else [
        (4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 4096), (8192, 8192, 16384)]
    cases = [(f"gemm {m}x{n}x{k} {layout}", gemm_case, (m, n, k, layout, (i, layout) == (0, "NN")))
             for i, (m, n, k) in enumerate(shapes) for layout in ("NN", "NT")]
    cases.append(("gemm fp8e4m3", fp8_case, (48, 40, 64) if smoke else (8192, 8192, 8192)))
    cases += [(op, memory_case, (op, *((16, 48) if smoke else (8192, 8192))))
              for op in ("softmax", "layer_norm", "rms_norm")]
    cases.append(("swiglu mlp", mlp_case, (8, 32, 48) if smoke else (4096, 4096, 14336)))
    cases += [("attention", attention_case, shape)
              for shape in ([(1, 2, 16, 16)] if smoke else [(4, 32, 2048, 128),
                                                              (1, 32, 8192, 128)])]
    failed = 0
    for label, case, params in cases:
        try:
            case(run, *params)
        except Exception as exc:  # one broken case must not cost the others their GPU time
            failed += 1
            print(f"{label} {params} FAILED: {type(exc).__name__}: {exc}", flush=True)
            why = f"{type(exc).__name__}: {exc}"[:300].replace("|", "/").replace("\n", " ")
            run.rows.append({"case": f"{label} {params}", "error": why, "ms": {}, "rate": {},
                             "max_rel_err": float("nan"), "unit": ""})
            run.write()
    print((args.out / "gpu.md").read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
