"""Deployable artifacts: tilefold's vs AOTInductor's `.pt2` and ONNX Runtime's `.onnx`.

One PyTorch model (`--model`: MiniLM with its real weights, or `tiny`, a one-layer BERT with
random weights for checking the plumbing) at batch x seq random tokens (8 x 128 by default) is
built into each artifact (`cli/aot_peers.py`): tilefold's by `tilefold.export`, AOTInductor's by
`torch._inductor.aoti_compile_and_package` (loaded by `aoti_load_package`), and ONNX Runtime's
by torch.onnx's TorchScript exporter when onnxruntime is installed (CPU provider, every graph
optimization); a peer that is not installed or fails to build is reported absent, with why.
For each: the artifact's size (in total; beyond the model's weights at their precision, below
zero where an artifact drops weights the model's output does not use; and its code: beyond the
weights and constants it holds, where they can be told apart, not for a `.pt2`);
load to first result in a new process (`cli/aot_start.py`; from the parent starting the
process to the first output, interpreter start included; the median of `--starts` processes,
interleaved across contenders, which may write Python's bytecode caches as a deployed
install would have them), and its peak RSS there; the tilefold artifact also from C,
through a small driver compiled by `cc` (`data/aot/bench_model.c`; its steady latency is its
own median, run alone). Steady latency: every artifact loaded in this process beside
tilefold's JIT (`tilefold.compile` of the same Module), timed interleaved after warm-up
calls, then alone. Every output is checked against eager PyTorch, and the artifact's against
the JIT's bit for bit. Every contender gets the same thread count. Times in the JSON are
seconds, sizes bytes. Run it under `flock -x` of the machine's benchmark lock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.cli import aot_peers, models
from tilefold.cli.aot_peers import AOTI, JIT, ORT, TILEFOLD, TILEFOLD_C, Artifact
from tilefold.cli.benchutil import Bench, Row, Section, Suite
from tilefold.cli.inputs import count
from tilefold.errors import TilefoldError

MODELS = ("minilm", "tiny")
STEADY_RUNS = 5  # calls each new process makes after its first, for its peak RSS
START_TIMEOUT_S = 300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm", choices=MODELS,
                        help="minilm (real weights, default) or tiny (a 1-layer BERT, random)")
    parser.add_argument("--batch", type=count(1), default=8, help="sequences (default 8)")
    parser.add_argument("--seq", type=count(1), default=128, help="tokens each (default 128)")
    parser.add_argument("--starts", type=count(1), default=5,
                        help="new processes per contender for load to first result (default 5)")
    parser.add_argument("--no-inductor", action="store_true", help="leave AOTInductor out")
    parser.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument("--no-c", action="store_true", help="leave the C driver out")


def load(name: str) -> Any:
    """The model in eval mode: MiniLM's sentence embedding, or the tiny BERT's last hidden
    state."""
    if name == "minilm":
        missing = models.missing_packages("minilm")
        if missing:
            raise TilefoldError(f"bench aot --model minilm needs {', '.join(missing)} "
                                f"({models.INSTALL}), or use --model tiny")
        return models.load_model("minilm", None)[0]
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=50,
                                     max_position_embeddings=64)
    return models.sentence_embedding(transformers.BertModel(config))


def run(args: argparse.Namespace, bench: Bench) -> int:
    (threads,) = args.thread_counts
    os.environ["TILEFOLD_NUM_THREADS"] = str(threads)  # before any pool starts
    try:
        import torch
    except ImportError:
        raise TilefoldError("bench aot needs PyTorch (the model is a PyTorch model); "
                            f"{models.INSTALL}") from None
    torch.set_num_threads(threads)
    model = load(args.model)
    g = torch.Generator().manual_seed(0)
    vocab = models.VOCAB["minilm"] if args.model == "minilm" else 50
    inputs = (torch.randint(0, vocab, (args.batch, args.seq), generator=g),
              torch.ones(args.batch, args.seq, dtype=torch.long))
    arrays = [t.numpy() for t in inputs]
    with torch.no_grad():
        want = model(*inputs).numpy()
    weights = aot_peers.weight_bytes(model)
    bench.note(f"{args.model}: batch {args.batch} x {args.seq} tokens, {threads} threads, "
               f"weights {weights / 1e6:.1f} MB; starts: median of {args.starts} new "
               f"processes; steady: medians of {args.rounds} rounds")
    with tempfile.TemporaryDirectory(prefix="tilefold-bench-aot-") as tmp:
        out = Path(tmp)
        artifacts, absent = _build(model, inputs, out, args, bench)
        sizes = {a.name: {"total_bytes": a.total_bytes(),
                          "beyond_weights_bytes": a.total_bytes() - weights,
                          "code_bytes": a.code_bytes(),
                          "build_s": a.build_s, "files": a.files} for a in artifacts}
        starts = _starts(artifacts, arrays, want, out, args, threads, bench, absent)
        steady, errors = _steady(artifacts, model, inputs, arrays, want, threads, bench)
    results = {"model": args.model, "batch": args.batch, "seq": args.seq, "threads": threads,
               "weights_bytes": weights, "torch": torch.__version__, "sizes": sizes,
               "starts": starts, "steady": steady, "max_abs_error_vs_eager": errors,
               "absent": absent}
    results["ratios"] = _ratios(results)
    for line in _report(results):
        bench.say(line)
    bench.extra.update(aot=results)
    return 0


def _build(model: Any, inputs: tuple, out: Path, args: argparse.Namespace, bench: Bench
           ) -> tuple[list[Artifact], dict[str, str]]:
    """tilefold's artifact (a failure is an error), then each peer's (a failure: absent)."""
    artifacts = [aot_peers.build_tilefold(model, inputs, out)]
    absent: dict[str, str] = {}
    peers = {AOTI: (aot_peers.build_aoti, "--no-inductor" if args.no_inductor else None),
             ORT: (aot_peers.build_onnx, "--no-ort" if args.no_ort else _no_ort())}
    for name, (build, reason) in peers.items():
        if reason is None:
            try:
                artifacts.append(build(model, inputs, out))
                continue
            except Exception as exc:  # a peer's own failure: reported, not fatal
                reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        absent[name] = reason
        bench.note(f"{name} absent: {reason}")
    return artifacts, absent


def _no_ort() -> str | None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install onnxruntime onnx)"
    return None


def _starts(artifacts: list[Artifact], arrays: list[np.ndarray], want: np.ndarray, out: Path,
            args: argparse.Namespace, threads: int, bench: Bench, absent: dict[str, str]
            ) -> dict[str, dict[str, float]]:
    """Per contender, over `--starts` new processes taken in turn: the medians of seconds to
    the first result (and, for Python, of those after the interpreter started) and of the
    peak RSS."""
    files = []
    for i, a in enumerate(arrays):
        files.append(str(out / f"in{i}.npy"))
        np.save(files[-1], a)
    commands = {a.name: [sys.executable, "-m", "tilefold.cli.aot_start", a.kind, str(a.path),
                         "START", str(threads), str(STEADY_RUNS), *files] for a in artifacts}
    if not args.no_c:
        try:
            binary = aot_peers.build_c_driver(artifacts[0].path, out)
            specs = aot_peers.c_specs(arrays, [want], out)
            commands[TILEFOLD_C] = [str(binary), "START", str(STEADY_RUNS),
                                    str(artifacts[0].path), *specs]
        except (OSError, subprocess.CalledProcessError) as exc:
            absent[TILEFOLD_C] = f"the C driver did not build: {exc}"
            bench.note(f"{TILEFOLD_C} absent: {absent[TILEFOLD_C]}")
    env = {**os.environ, "TILEFOLD_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as deployed: the first start writes what
    # later ones read, rather than each compiling every module it imports from source
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    for _ in range(args.starts):
        for name, command in commands.items():
            samples[name].append(_start_once(name, command, env))
    return {name: {key: statistics.median(s[key] for s in runs) for key in runs[0]}
            for name, runs in samples.items()}


def _start_once(name: str, command: list[str], env: dict[str, str]) -> dict[str, float]:
    start = time.time_ns()
    command = [str(start) if c == "START" else c for c in command]
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=START_TIMEOUT_S, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or lines or [f"exit {done.returncode}"])[-1]
        raise TilefoldError(f"bench aot: a new process running {name} failed: {why}")
    return json.loads(lines[-1])


def _steady(artifacts: list[Artifact], model: Any, inputs: tuple, arrays: list[np.ndarray],
            want: np.ndarray, threads: int, bench: Bench
            ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Every artifact loaded here, and tilefold's JIT of the same Module, timed interleaved;
    each checked against eager, the artifact against the JIT bit for bit."""
    import tilefold
    from tilefold.frontend.aot_export import torch_module

    module, _, _ = torch_module(model, inputs)
    jit = tilefold.compile(module)
    calls = {JIT: lambda: jit(*arrays)}
    for a in artifacts:
        calls[a.name] = a.load(threads, arrays)
    errors = {}
    for name, call in calls.items():
        got = _first(call())
        if got.shape != want.shape:
            raise TilefoldError(f"bench aot: {name} returned shape {list(got.shape)}, eager "
                                f"{list(want.shape)}")
        errors[name] = float(np.abs(got - want).max())
    artifact, compiled = _first(calls[TILEFOLD]()), _first(calls[JIT]())
    if artifact.tobytes() != compiled.tobytes():
        raise TilefoldError("bench aot: the artifact's output differs from the JIT's; this is "
                            "a tilefold bug, please report it")
    section = Section(f"steady latency, batch x seq {arrays[0].shape}, {threads} threads",
                      f"{'model':<10}", "ms", threads=threads, us=TILEFOLD)
    timings = bench.measure(calls, ours=(TILEFOLD, JIT), warm_calls=2, settle=0.05)
    section.rows.append(Row("model", f"{'model':<10}", timings))
    bench.table(section)
    return ({name: {"interleaved_s": t.interleaved, "alone_s": t.alone}
             for name, t in timings.items()}, errors)


def _first(outputs: Any) -> np.ndarray:
    """The first output as an array, from a list of them or one tensor (AOTInductor's runner
    returns the model's output as the model does)."""
    if isinstance(outputs, (list, tuple)):
        outputs = outputs[0]
    return np.asarray(outputs)


def _ratios(results: dict[str, Any]) -> dict[str, float]:
    """tilefold's figure over each peer's (below 1: tilefold's is smaller or faster)."""
    ratios = {}
    sizes, starts, steady = results["sizes"], results["starts"], results["steady"]
    for peer in (AOTI, ORT):
        if peer in sizes:
            ratios[f"total bytes vs {peer}"] = (sizes[TILEFOLD]["total_bytes"]
                                                / sizes[peer]["total_bytes"])
        if peer in starts:
            for ours in (TILEFOLD, TILEFOLD_C):
                if ours in starts:
                    ratios[f"first result {ours} vs {peer}"] = (
                        starts[ours]["first_result_s"] / starts[peer]["first_result_s"])
        if peer in steady:
            ratios[f"steady vs {peer}"] = (steady[TILEFOLD]["interleaved_s"]
                                           / steady[peer]["interleaved_s"])
    ratios[f"steady vs {JIT}"] = steady[TILEFOLD]["interleaved_s"] / steady[JIT]["interleaved_s"]
    return ratios


def _size_cells(size: dict[str, Any] | None) -> str:
    if size is None:
        return f"{'-':>10}{'-':>14}{'-':>9}{'-':>9}"
    code = size["code_bytes"]
    return (f"{size['total_bytes'] / 1e6:>10.2f}{size['beyond_weights_bytes'] / 1e6:>14.2f}"
            + (f"{code / 1e6:>9.3f}" if code is not None else f"{'-':>9}")
            + f"{size['build_s']:>9.1f}")


def _report(results: dict[str, Any]) -> list[str]:
    lines = ["", f"{'contender':<24}{'total MB':>10}{'beyond w. MB':>14}{'code MB':>9}"
                 f"{'build s':>9}"
                 f"{'first result s':>16}{'peak RSS MB':>13}{'steady ms':>11}"]
    names = [TILEFOLD, TILEFOLD_C, AOTI, ORT, JIT]
    for name in names:
        size, start = results["sizes"].get(name), results["starts"].get(name)
        steady = results["steady"].get(name)
        if size is None and start is None and steady is None:
            continue
        cells = [_size_cells(size)]
        cells.append(f"{start['first_result_s']:>16.3f}{start['peak_rss_bytes'] / 1e6:>13.0f}"
                     if start else f"{'-':>16}{'-':>13}")
        if steady:
            cells.append(f"{1e3 * steady['interleaved_s']:>11.2f}")
        elif start:  # the C driver: its own median, alone
            cells.append(f"{1e3 * start['steady_s']:>10.2f}*")
        lines.append(f"{name:<24}" + "".join(cells))
    lines.append("(* the C driver's own median of its calls, alone; the rest interleaved)")
    lines.append("(beyond w.: total minus all the model's parameters and buffers, below 0 where "
                 "an artifact drops unused ones; code: total minus the weights and constants "
                 "it holds, where they can be told apart)")
    lines += [f"{k}: {v:.3f}x" for k, v in results["ratios"].items()]
    lines += [f"absent: {k}: {v}" for k, v in results["absent"].items()]
    lines.append("max abs error vs eager: " + ", ".join(
        f"{k} {v:.1e}" for k, v in results["max_abs_error_vs_eager"].items()))
    return lines


SUITE = Suite("aot", __doc__, add_arguments, run, rounds=5, threads="all")
