"""tilefold's GPU kernels on one GPU against cuBLAS, torch._scaled_mm, SDPA and torch.compile.

    bash benchmarks/gpu.sh OUT_DIR            # on a CUDA machine: imports checked, 8 minutes
    python benchmarks/gpu.py OUT_DIR --smoke  # tiny shapes on the CPU, Triton's interpreter

The run is a list of cases, each in its own process with its own timeout (an illegal address,
a TMA barrier hang or a crash ends that case only), in this order: the GPU tests compiled on
the device (`TILEFOLD_GPU_DEVICE=1 pytest tests/gpu`), bf16 GEMMs against cuBLAS (the pointer
variant, bf16 outputs), an fp8 e4m3 GEMM with row-wise scales against `torch._scaled_mm` (both
accumulation modes of each), causal attention against SDPA (naming the SDPA kernel that ran),
softmax/layer_norm/rms_norm against torch.compile in TB/s, a SwiGLU MLP and one transformer
decode step through `torch.compile(backend="tilefold")`, and last the persistent TMA GEMMs
(the cases most likely to hang). Every case runs strict (TILEFOLD_STRICT=1), checks its answer
against an f32 reference first (error over the reference's largest magnitude), then times each
contender (`do_bench` medians; `--smoke`: perf_counter medians). Template configs race in
tilefold's one chooser (`strategy.select.choose` on the GPU platform): "tilefold" is the best
config it measured, "chosen" the winner with the library kernel raced beside it. The tables,
OUT_DIR/gpu.md and OUT_DIR/gpu.json, are rewritten after every case, so a run cut short keeps
what it measured; each case's output is in OUT_DIR/logs/.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# what the run imports; the H200 image holds them all (gpu.sh installs nothing)
NEEDED = ("numpy", "llvmlite", "ml_dtypes", "torch", "triton", "pytest", "tilefold")


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter)")
    p.add_argument("--only", default="", help="comma-separated substrings of the cases to run")
    p.add_argument("--budget", type=float, default=465.0,
                   help="seconds the whole run may take (each case's timeout is cut to fit)")
    p.add_argument("--configs", type=int, default=4, help="GEMM configs proposed per shape")
    p.add_argument("--tune-budget", type=float, default=15.0,
                   help="seconds tilefold's tuner may spend on one problem, compiles included")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # a child: run this one
    return p.parse_args(argv)


# --- the parent: cases in their own processes ----------------------------------------------

@dataclass
class Case:
    """One step of the run: `argv` runs it (a child writes its rows to `rows_file`), killed
    with its process group after `timeout` seconds."""

    name: str
    argv: list[str]
    timeout: float
    env: dict[str, str] = field(default_factory=dict)


def missing_imports() -> list[str]:
    """What of NEEDED this Python cannot import, with why."""
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or a broken install raising anything
            missing.append(f"{name} ({type(exc).__name__}: {exc})")
    return missing


def case_file(out: Path, name: str) -> Path:
    return out / "cases" / (name.replace(" ", "_").replace("/", "_") + ".json")


class Tables:
    """The run's rows; gpu.md and gpu.json rewritten after each."""

    def __init__(self, out: Path, device: str):
        self.out, self.device, self.rows = out, device, []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, rows: list[dict]) -> None:
        self.rows += rows
        self.write()

    def write(self) -> None:
        (self.out / "gpu.json").write_text(json.dumps({"device": self.device,
                                                       "rows": self.rows}, indent=1))
        names = sorted({k for r in self.rows for k in r.get("ms", {})})
        lines = [f"# tilefold GPU benchmark on {self.device} (ms; in brackets tflop/s, or TB/s "
                 "for memory-bound cases)", "",
                 "| case | err | " + " | ".join(names) + " | note |",
                 "|" + "---|" * (len(names) + 3)]
        for r in self.rows:
            digits = 2 if r.get("unit") == "TB/s" else 0
            ms, rate = r.get("ms", {}), r.get("rate", {})
            cells = [f"{ms[k]:.3f} ({rate[k]:.{digits}f})" if k in ms else "-" for k in names]
            err = r.get("max_rel_err")
            note = str(r.get("note", "")).replace("|", "/").replace("\n", " ")
            lines.append(f"| {r['case']} | {'-' if err is None else f'{err:.1e}'} | "
                         + " | ".join(cells) + f" | {note} |")
        (self.out / "gpu.md").write_text("\n".join(lines) + "\n")


def run_case(case: Case, out: Path, timeout: float) -> list[dict]:
    """Run one case in its own process group; its rows, or one row saying how it failed."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / (case.name.replace(" ", "_").replace("/", "_") + ".log")
    rows_file = case_file(out, case.name)
    rows_file.unlink(missing_ok=True)
    start = time.perf_counter()
    with log.open("w") as sink:
        child = subprocess.Popen(case.argv, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
                                 env={**os.environ, **case.env}, start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
            why = None if code == 0 else _exit_reason(code)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the case and anything it started
            child.wait()
            why = f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    text = log.read_text(errors="replace")
    print(f"== {case.name} ({seconds:.0f} s{'' if why is None else ', ' + why})\n"
          + text[-4000:], flush=True)
    rows = json.loads(rows_file.read_text()) if rows_file.exists() else []
    tail = " ".join(text.strip().splitlines()[-3:])[-300:]
    if why is not None:
        rows.append({"case": case.name, "failed": True, "note": f"FAILED ({why}): {tail}"})
    elif not rows:  # a step that records no row of its own (the tests): its last words
        rows.append({"case": case.name, "note": f"ok: {tail}"})
    for r in rows:
        r.setdefault("seconds", round(seconds, 1))
    return rows


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_cases(cases: list[Case], tables: Tables, budget: float) -> int:
    """Run `cases` in order within `budget` seconds (a case's timeout cut to what is left);
    the number that failed or did not run."""
    deadline = time.perf_counter() + budget
    failed = 0
    for case in cases:
        left = deadline - time.perf_counter()
        if left < 10:
            tables.add([{"case": case.name, "failed": True,
                         "note": "not run: the run's time budget is spent"}])
            failed += 1
            continue
        rows = run_case(case, tables.out, min(case.timeout, left - 5))
        failed += any(r.get("failed") for r in rows)
        tables.add(rows)
    return failed


# case name -> (function name, its arguments, timeout in seconds); in run order, TMA last
def plan(smoke: bool) -> list[tuple[str, str, tuple, float]]:
    gemms = [(64, 48, 80, "NN"), (33, 64, 100, "NT")] if smoke else [
        (4096, 4096, 4096, "NN"), (8192, 8192, 8192, "NN"), (8192, 8192, 8192, "NT")]
    tma = [(64, 48, 80, "NN"), (64, 48, 80, "NT")] if smoke else [
        (8192, 8192, 8192, "NN"), (8192, 8192, 8192, "NT")]
    out: list[tuple[str, str, tuple, float]] = []
    out += [(f"gemm bf16 {m}x{n}x{k} {lay}", "gemm_case", (m, n, k, lay, False), 60)
            for m, n, k, lay in gemms]
    out.append(("gemm fp8e4m3 row-scaled", "fp8_case",
                (48, 40, 256) if smoke else (8192, 8192, 8192), 75))
    out += [(f"attention causal {b}x{h}x{s}x{d}", "attention_case", (b, h, s, d), 60)
            for b, h, s, d in ([(1, 2, 40, 16)] if smoke else [(4, 32, 2048, 128),
                                                               (1, 32, 8192, 128)])]
    out += [(op, "memory_case", (op, *((16, 48) if smoke else (8192, 8192))), 60)
            for op in ("softmax", "layer_norm", "rms_norm")]
    out.append(("swiglu mlp", "mlp_case", (8, 32, 48) if smoke else (4096, 4096, 14336), 90))
    out.append(("decode step", "decode_case", (32, 4, 2, 64, 17) if smoke else
                (4096, 32, 8, 14336, 2048), 90))
    out += [(f"gemm bf16 TMA {m}x{n}x{k} {lay}", "gemm_case", (m, n, k, lay, True), 60)
            for m, n, k, lay in tma]
    return out


def cases(args: argparse.Namespace) -> list[Case]:
    py = sys.executable
    flags = [*(["--smoke"] if args.smoke else []), "--configs", str(args.configs),
             "--tune-budget", str(args.tune_budget)]
    strict = {"TILEFOLD_STRICT": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # the device tests first: the kernels compiled for this GPU against float64 (under --smoke
    # one file of them, interpreted)
    tests = ["tests/gpu/test_triton_interpret.py"] if args.smoke else ["tests/gpu"]
    device = {} if args.smoke else {"TILEFOLD_GPU_DEVICE": "1"}
    out = [Case("device tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                120, {**strict, **device})]
    out += [Case(name, [py, str(Path(__file__).resolve()), str(args.out), "--case", name,
                        *flags], timeout, strict)
            for name, _, _, timeout in plan(args.smoke)]
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    return [c for c in out if not only or any(s in c.name for s in only)]


def device_name(smoke: bool) -> str:
    if smoke:
        return "cpu (Triton's interpreter; tiles as for h200)"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.case is not None:
        return child_main(args)
    missing = missing_imports()
    if missing:
        print("benchmarks/gpu.py: cannot run, missing: " + "; ".join(missing) +
              "\n(this script installs nothing: the image must hold them; run with "
              "PYTHONPATH=src as gpu.sh does)", file=sys.stderr)
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("benchmarks/gpu.py: torch sees no CUDA device (use --smoke on a CPU)",
              file=sys.stderr)
        return 2
    tables = Tables(args.out, device_name(args.smoke))
    failed = run_cases(cases(args), tables, args.budget)
    print((args.out / "gpu.md").read_text())
    return 1 if failed else 0


# --- a child: one case ---------------------------------------------------------------------

class Run:
    """The device, dtype, timer and tuner of one case; `record` writes its rows."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from tilefold.strategy import TuningDB, context
        from tilefold.target import detect_gpu, gpu_target

        self.args, self.torch, self.smoke = args, torch, args.smoke
        self.device = "cpu" if self.smoke else "cuda"
        self.target = gpu_target("h200") if self.smoke else (detect_gpu() or gpu_target("h100"))
        self.dtype = torch.bfloat16
        self.ctx, self.db = context(self.target, timer=self.bench), TuningDB()
        self.rows: list[dict] = []

    def bench(self, fn) -> float:
        """Milliseconds a call of `fn` takes (the median of its repeats; `--smoke` runs the
        interpreter: a `perf_counter` median)."""
        from tilefold.strategy.platform import device_timer

        return device_timer(fn, warmup=25, rep=100)

    def randn(self, *shape: int, dtype: Any = None) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=dtype or self.dtype)

    def compiled(self, fn):
        return self.torch.compile(fn, dynamic=False)

    def record(self, case: str, work: float, unit: str, want, got: dict[str, Any],
               timings: dict[str, float], note: str = "") -> None:
        """One row: `work` is flops (unit "tflop/s") or bytes moved ("TB/s"); `got` maps
        contenders to their results, checked against `want` (an f32 reference)."""
        w = want.float()
        scale = float(w.abs().max()) or 1.0
        errs = {k: float((g.float() - w).abs().max()) / scale for k, g in got.items()}
        err = max(errs.values())
        self.rows.append({"case": case, "max_rel_err": err, "errors": errs, "ms": timings,
                          "unit": unit, "note": note,
                          "rate": {k: work / v / 1e9 for k, v in timings.items()}})
        print(case, f"err {err:.1e}", {k: f"{v:.3f} ms" for k, v in timings.items()}, note,
              flush=True)
        path = case_file(self.args.out, self.args.case)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.rows))


def candidates(method: str, configs: list, template, extern, **key: Any) -> list:
    """`template(config)` (a runner: tensors in, outputs out) at each config, in order, then
    `extern` (a runner), as the chooser's candidates; `key` joins each config's name."""
    from dataclasses import asdict

    from tilefold.strategy import Candidate, Kernel

    def kernel(run):
        return Kernel(lambda *ts: run(list(ts)))

    out = [Candidate(method, "building-blocks", {**asdict(c), **key}, float(i),
                     lambda c=c: kernel(template(c))) for i, c in enumerate(configs)]
    return [*out, Candidate("extern.torch.gpu", "extern", key, float(len(out)),
                            lambda: kernel(extern))]


def tuned(run: Run, problem: Any, tensors: list, candidates: list) -> tuple[dict, str, Any]:
    """tilefold's chooser over `candidates` (template configs, then the extern) on `tensors`
    (`problem`: the op they compute, for the tuning key and the answer's tolerance): the
    timings of the best template config and of the chosen candidate (ms), the best config's
    name, and that config's runner (to check it, not the extern)."""
    from dataclasses import replace

    from tilefold.strategy import select

    ctx = replace(run.ctx, arrays=tuple(tensors))
    decision = select.choose(problem, ctx, candidates, [], run.db, run.args.tune_budget)
    measured = {key: s * 1e3 for key, s in decision.measured.items()
                if not key.startswith("extern.")}
    best = min(measured, key=measured.get)
    timings = {"tilefold": measured[best],
               "chosen": decision.measured[decision.winner.key] * 1e3}
    failures = "; ".join(f"{k}: {v}"[:160] for k, v in decision.failures.items())
    kernel = next(c for c in candidates if c.key == best).build()
    return timings, best + (f" (failed: {failures})" if failures else ""), \
        lambda ts: kernel.run(*ts)


def matmul_problem(m: int, n: int, k: int, dtype: str) -> Any:
    """The lone matmul an M x N x K GEMM in `dtype` computes, as the chooser's problem."""
    from tilefold.ir import functional as F
    from tilefold.ir import trace
    from tilefold.strategy import Problem

    fn = trace(lambda a, b: F.matmul(a, b), ("a", dtype, (m, k)), ("b", dtype, (k, n)))["main"]
    op = next(o for o in fn.ops if o.name == "matmul")
    return Problem.of(op, [(m, k), (k, n)])


def tuned_gemm(run: Run, mnk: tuple[int, int, int], dot: str, tensors: list,
               make, extern, tma: bool, fast: bool = False) -> tuple[dict[str, float], str, Any]:
    """`tuned` over the GEMM template (`make(split)` -> a `TritonGemm`; tensors: A, B, then
    the epilogue's) at its proposed pointer configs, or (`tma`) at the persistent TMA ones
    only, and `extern`."""
    from tilefold.codegen.triton.gemm_config import propose_configs

    gemms: dict[str, Any] = {"none": make("none")}
    if tma and gemms["none"].tma_order(*tensors[:2]) is None:
        raise RuntimeError(f"{dot}: the operands do not suit tensor descriptors")

    def template(config):
        split = "none" if config.split_k == 1 else "workspace"
        if split not in gemms:
            gemms[split] = make(split)
        return lambda ts, gemm=gemms[split]: gemm(*ts[:2], epilogue_inputs=ts[2:], config=config)

    configs = propose_configs(run.target, *mnk, dot, limit=run.args.configs, tma=tma,
                              out_dtype="bf16", fp8_fast_accum=fast)
    configs = [c for c in configs if bool(c.persistent) == tma]
    if tma and not configs:
        raise RuntimeError(f"{dot}: the chooser is offered no persistent TMA config here")
    return tuned(run, matmul_problem(*mnk, dot), tensors,
                 candidates("triton.gemm", configs, template, extern, fp8_fast_accum=fast))


def gemm_case(run: Run, m: int, n: int, k: int, layout: str, tma: bool) -> None:
    """A bf16 GEMM into bf16 C (as cuBLAS writes it), B row-major (NN) or a transposed view of
    a row-major [N, K] (NT, a linear layer's weight)."""
    from tilefold.codegen.triton.gemm_launch import TritonGemm

    torch = run.torch
    a = run.randn(m, k)
    b = run.randn(n, k).t() if layout == "NT" else run.randn(k, n)
    timings, best, template = tuned_gemm(
        run, (m, n, k), "bf16", [a, b],
        lambda split: TritonGemm("bf16", "bf16", split=split, out_dtypes=("bf16",)),
        lambda ts: [torch.matmul(*ts)], tma)
    timings["cublas"] = run.bench(lambda: torch.matmul(a, b))
    want = a.float() @ b.float()
    run.record(f"gemm bf16{' TMA' * tma} {m}x{n}x{k} {layout}", 2 * m * n * k, "tflop/s", want,
               {"tilefold": template([a, b])[0], "cublas": torch.matmul(a, b)}, timings,
               f"config {best}")


def fp8_case(run: Run, m: int, n: int, k: int) -> None:
    """e4m3 A [M, K] and B [K, N] (column-major, as _scaled_mm takes it) with f32 scales per
    row of A and per column of B, applied in the template's epilogue, into bf16; tilefold's
    template and _scaled_mm each with precise and with fast (fp8) accumulation."""
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
    tensors = [a, b, sa, sb]

    def scaled_mm(ts, fast=False):
        return [torch._scaled_mm(ts[0], ts[1], scale_a=ts[2], scale_b=ts[3],
                                 out_dtype=torch.bfloat16, use_fast_accum=fast)]

    timings, got, notes = {}, {}, []
    for fast in (False, True):
        suffix = "-fast" * fast
        t, best, template = tuned_gemm(
            run, (m, n, k), "fp8e4m3", tensors,
            lambda split, fast=fast: TritonGemm(
                "fp8e4m3", "fp8e4m3", epilogue=plan.program, stores=plan.stores, split=split,
                out_dtypes=("bf16",), fp8_fast_accum=fast),
            lambda ts, fast=fast: scaled_mm(ts, fast), tma=False, fast=fast)
        timings[f"tilefold{suffix}"] = t["tilefold"]
        timings[f"scaled_mm{suffix}"] = run.bench(lambda fast=fast: scaled_mm(tensors, fast))
        got[f"tilefold{suffix}"] = template(tensors)[0]
        got[f"scaled_mm{suffix}"] = scaled_mm(tensors, fast)[0]
        notes.append(f"{'fast' if fast else 'precise'} {best}")
    want = (a.float() @ b.float()) * sa * sb
    run.record(f"gemm fp8e4m3 row-scaled {m}x{n}x{k}", 2 * m * n * k, "tflop/s", want, got,
               timings, "; ".join(notes))


def sdpa_kernel(torch, fn) -> str:
    """The name of the longest kernel (or CPU op) a call of `fn` runs: which SDPA backend."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available()
                                     else [])
    with profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = prof.key_averages()
    if torch.cuda.is_available():
        gpu = [e for e in events if getattr(e, "device_time_total", 0) > 0
               and "aten::" not in e.key]
        if gpu:
            return max(gpu, key=lambda e: e.device_time_total).key[:80]
    ops = [e for e in events if "attention" in e.key and e.key != "aten::scaled_dot_product_"
           "attention"]
    return (min(ops, key=lambda e: len(e.key)).key if ops else "unknown")[:80]


def attention_case(run: Run, bsz: int, heads: int, seq: int, dim: int) -> None:
    from tilefold.codegen.triton.attention import TritonAttention
    from tilefold.codegen.triton.attention_config import propose_attention_configs
    from tilefold.ir import trace
    from tilefold.strategy import Problem

    q, k, v = (run.randn(bsz, heads, seq, dim) for _ in range(3))
    att = TritonAttention("bf16", causal=True)
    sdpa = run.torch.nn.functional.scaled_dot_product_attention
    shape = (bsz, heads, seq, dim)
    fn = trace(lambda q, k, v: q.builder.op("scaled_dot_product_attention", q, k, v,
                                            is_causal=True),
               *((name, "bf16", shape) for name in "qkv"))["main"]
    problem = Problem.of(fn.ops[0], [shape] * 3)
    configs = propose_attention_configs(run.target, bsz * heads, seq, seq, dim, "bf16",
                                        limit=run.args.configs)
    timings, best, template = tuned(run, problem, [q, k, v], candidates(
        "triton.attention", configs, lambda c: lambda ts: [att(*ts, **c.launch())],
        lambda ts: [sdpa(*ts, is_causal=True)]))
    timings["sdpa"] = run.bench(lambda: sdpa(q, k, v, is_causal=True))
    backend = sdpa_kernel(run.torch, lambda: sdpa(q, k, v, is_causal=True))
    flops = 2 * bsz * heads * seq * seq * dim  # two products, half the scores (causal)
    want = sdpa(q.float(), k.float(), v.float(), is_causal=True)
    run.record(f"attention causal {bsz}x{heads}x{seq}x{dim}", flops, "tflop/s", want,
               {"tilefold": template([q, k, v])[0], "sdpa": sdpa(q, k, v, is_causal=True)},
               timings, f"config {best}; SDPA ran {backend}")


def memory_case(run: Run, op: str, rows: int, cols: int) -> None:
    """softmax, layer_norm or rms_norm over the last axis of bf16 [rows, cols]."""
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
    module = trace(ir, ("x", "bf16", (rows, cols)),
                   *((f"p{i}", "bf16", (cols,)) for i in range(params)))
    graph = tf.compile(module, target=run.target, strict=True)
    timings = {"tilefold": run.bench(lambda: graph(*args)), "eager": run.bench(lambda: ref(*args))}
    got = {"tilefold": graph(*args)[0], "eager": ref(*args)}
    if not run.smoke:
        comp = run.compiled(ref)
        timings["compile"] = run.bench(lambda: comp(*args))
        got["compile"] = comp(*args)
    moved = 2 * args[0].numel() * args[0].element_size()  # x read once, the result written once
    run.record(f"{op} bf16 {rows}x{cols}", moved, "TB/s", ref(*(a.float() for a in args)), got,
               timings)


def _gpu_path_on_cpu(run: Run) -> None:
    """Under --smoke, torch.compile(backend="tilefold") takes the GPU path (tilefold.gpu under
    the interpreter) for CPU tensors, as tests/gpu/test_gpu_dynamo.py does."""
    import tilefold.frontend.gpu_runner as gpu_runner

    if run.smoke:
        gpu_runner._on_gpu = lambda t: isinstance(t, run.torch.Tensor)
        gpu_runner.detect_gpu = lambda: run.target


def through_tilefold(run: Run, label: str, model, inputs: list, work: float,
                     outputs: int = 1) -> None:
    """`model` (bf16) through torch.compile(backend="tilefold") against eager and
    torch.compile, checked against the model in f32 (its first output, of `outputs`)."""
    import copy

    from tilefold.frontend import report
    from tilefold.frontend.dynamo import register

    torch = run.torch
    _gpu_path_on_cpu(run)
    register()
    with torch.no_grad():
        ours = torch.compile(model, backend="tilefold", dynamic=False,
                             options={"strict": True})
        got = {"tilefold": ours(*inputs)}
        graph = report.reports()[-1]
        print("tilefold ran", graph.executor, graph.methods(), flush=True)
        timings = {"tilefold": run.bench(lambda: ours(*inputs)),
                   "eager": run.bench(lambda: model(*inputs))}
        got["eager"] = model(*inputs)
        if not run.smoke:
            comp = run.compiled(model)
            timings["compile"] = run.bench(lambda: comp(*inputs))
            got["compile"] = comp(*inputs)
        want = copy.deepcopy(model).float()(*(x.float() for x in inputs))
    if outputs > 1:
        got, want = {k: v[0] for k, v in got.items()}, want[0]
    run.record(label, work, "tflop/s", want, got, timings,
               f"{graph.executor}: {graph.methods()}")


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
    model = swiglu(run.torch, d, ff).to(device=run.device, dtype=run.dtype).eval()
    through_tilefold(run, f"swiglu mlp bf16 {tokens}x{d}x{ff}", model,
                     [run.randn(tokens, d) / 4], 6 * tokens * d * ff)


def decoder(torch, d: int, heads: int, kv_heads: int, ff: int):
    """One LLaMA-style block for one new token: rms_norm, the q/k/v projections, grouped-query
    attention of the query over a KV cache that already holds this token's slot (the caller
    writes the returned k and v there, as a paged cache's own kernel does), the output
    projection and a residual, then rms_norm and a SwiGLU MLP with a residual."""
    hd = d // heads

    class RMSNorm(torch.nn.Module):  # x * x, not torch's x.pow(2): pow has no Triton form yet
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q = torch.nn.Linear(d, d, bias=False)
            self.kv = torch.nn.Linear(d, 2 * kv_heads * hd, bias=False)
            self.o = torch.nn.Linear(d, d, bias=False)
            self.mlp = swiglu(torch, d, ff)

        def forward(self, x, k_cache, v_cache):  # x [1, d]; caches [1, kv_heads, L, hd]
            h = self.n1(x)
            q = self.q(h).reshape(1, heads, 1, hd)
            kv = self.kv(h)
            a = torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache,
                                                                 enable_gqa=True)
            x = x + self.o(a.reshape(1, d))
            return x + self.mlp(self.n2(x)), kv

    return Block()


def decode_case(run: Run, d: int, heads: int, kv_heads: int, ff: int, cached: int) -> None:
    model = decoder(run.torch, d, heads, kv_heads, ff).to(device=run.device,
                                                          dtype=run.dtype).eval()
    hd = d // heads
    inputs = [run.randn(1, d), run.randn(1, kv_heads, cached, hd),
              run.randn(1, kv_heads, cached, hd)]
    work = 2 * (2 * d * d + 2 * d * kv_heads * hd + 3 * d * ff + 2 * heads * cached * hd)
    through_tilefold(run, f"decode step bf16 d{d} ff{ff} cache {cached}", model, inputs, work,
                     outputs=2)


def child_main(args: argparse.Namespace) -> int:
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    else:  # the graphs through torch.compile are tuned too (seconds a problem)
        os.environ.setdefault("TILEFOLD_TUNE", str(args.tune_budget))
    run = Run(args)
    step = {name: (fn, params) for name, fn, params, _ in plan(args.smoke)}
    fn, params = step[args.case]
    globals()[fn](run, *params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
