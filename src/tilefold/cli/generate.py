"""`tilefold generate`: generate text with a causal LM through tilefold, beside its peers.

It prints tilefold's text and, for each contender (tilefold at --quant; with --compare, PyTorch
eager and inductor, each through `model.generate` and through tilefold's generation loop,
torchao's weight-only model through inductor and through tilefold, and llama.cpp at the
matching GGUF type), prompt and decode tokens/s, the time to the first token
in a cold and a warm process, peak RSS, bytes read per token and the share of the host's
measured read bandwidth. Every contender runs in processes of its own with the same threads.
`--perplexity FILE` adds the perplexity of every precision on the first N tokens of FILE and
the KL divergence of its next-token distributions from PyTorch eager's f32 logits.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from tilefold.cli import llm_models, llm_report, llm_runs
from tilefold.cli.inputs import count
from tilefold.cli.llm_runs import COMPARE, LLAMA_FOR, QUANTS, Job, Workload
from tilefold.cli.llm_worker import native_gguf
from tilefold.errors import TilefoldError
from tilefold.target import cache_dir

ALL_FORMATS = list(QUANTS.values())  # the precisions --perplexity compares


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with a causal LM, beside its peers",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-tokens", type=count(1), default=None,
                        help="a prompt of N tokens of a fixed text (default 256)")
    p.add_argument("--rounds", type=count(1), default=3,
                   help="timed generations per contender, in turn and alone (default 3)")
    p.add_argument("--new-tokens", type=count(1), default=128,
                   help="tokens to generate (default 128)")
    p.add_argument("--quant", default="none", help="tilefold's weights: none (f32), int8 or int4")
    p.add_argument("--activations", choices=("auto", "f32", "int8"), default="auto",
                   help="int8: tilefold's weight-only GEMMs may quantize their inputs to int8 "
                        "per 32 (as llama.cpp's Q4_0/Q8_0 paths do) for integer dot products; "
                        "f32: exact to f32 rounding; auto (default): int8 where the host has "
                        "an integer dot (VNNI, or AVX2 pmaddubsw)")
    p.add_argument("--max-length", type=count(1), default=None,
                   help="positions of the KV cache (default: prompt + new tokens)")
    p.add_argument("--compare", default="",
                   help=f"peers, comma-separated: {','.join(COMPARE)} (default: none)")
    p.add_argument("--threads", type=count(1), default=len(os.sched_getaffinity(0)),
                   help="threads for every contender (default: all cores)")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--profile", action="store_true",
                   help="instead: where tilefold's decode step spends its time, by kernel")
    p.set_defaults(handler=handle)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """What `generate` and `bench llm` share: the model, strictness, accuracy."""
    p.add_argument("--model", default="smollm2",
                   help=f"{' | '.join(llm_models.NAMES)} | HF_DIR | FILE.gguf (default smollm2)")
    p.add_argument("--strict", action="store_true",
                   help="fail when tilefold leaves any of the model to PyTorch")
    p.add_argument("--perplexity", metavar="FILE", default=None,
                   help="also measure perplexity and KL divergence on the text in FILE")
    p.add_argument("--perplexity-tokens", type=count(2), default=1024,
                   help="tokens of FILE to score, one window (default 1024)")


def parse_quants(text: str) -> list[str]:
    """`none`, `int8`, `int4`, or several comma-separated: tilefold's formats."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in QUANTS]
    if bad or not names:
        raise TilefoldError(f"--quant {text!r}: use none, int8 or int4")
    return [QUANTS[n] for n in dict.fromkeys(names)]


def parse_compare(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in COMPARE]
    if bad:
        raise TilefoldError(f"--compare {', '.join(bad)}: choose from {','.join(COMPARE)}")
    return list(dict.fromkeys(names))


def say(text: str) -> None:
    """Progress, on stderr (stdout carries the results)."""
    print(text, file=sys.stderr, flush=True)


def open_model(args: argparse.Namespace) -> tuple[llm_models.Prepared, Any, Any]:
    """(the prepared model, its config, its tokenizer or None) for --model."""
    source = llm_models.resolve(args.model)
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise TilefoldError(f"tilefold generate needs {', '.join(missing)}: "
                            'pip install -e ".[demo]"')
    prepared = llm_models.prepare(source, say)
    return prepared, llm_models.load_config(prepared), llm_models.load_tokenizer(prepared)


def host_lines(threads: int) -> tuple[list[str], float]:
    """The header naming the host, and its measured read bandwidth at `threads` (GB/s)."""
    from tilefold.target import host_target, measured_bandwidth_gbps

    target = host_target()
    gbps = measured_bandwidth_gbps(threads)
    cores = len(os.sched_getaffinity(0))
    return [f"host: {target.name}, {cores} cores, L2 {target.l2_bytes >> 10} KiB, L3 "
            f"{target.l3_bytes >> 20} MiB; read bandwidth {gbps:.1f} GB/s at {threads} "
            "thread(s) (tilefold bench memory's probe)"], gbps


def accuracy(work: Workload, formats: list[str], llama: bool, path: str, count_: int,
             tokenizer: Any, activations: str = "f32") -> tuple[list[str], dict[str, Any]]:
    """The perplexity table's lines and JSON: PyTorch eager f32 as the reference, tilefold at
    each format, llama.cpp at the matching types and on the file as shipped."""
    tokens = llm_models.text_tokens(tokenizer, path, count_)
    jobs = [Job("tilefold", fmt) for fmt in formats]
    if activations != "f32":
        jobs += [Job("tilefold", fmt, activations=activations) for fmt in formats
                 if fmt != "f32"]
    if llama:
        jobs += [Job("llamacpp", LLAMA_FOR[fmt]) for fmt in formats]
        jobs.append(Job("llamacpp", "shipped", f"llama.cpp {_file_type(work.model.gguf)} file"))
    say(f"perplexity on {len(tokens)} tokens of {path}")
    found = llm_runs.accuracy_all(work, Job("hf-eager", "f32", "PyTorch eager f32"), jobs,
                                  tokens, say)
    head = (f"perplexity on the first {len(tokens)} tokens of {path} (one window of "
            f"{len(tokens)} tokens, each position after the first scored); KL divergence of "
            "next-token distributions from the reference's, top-1 agreement with it")
    return ["", head, *llm_report.accuracy_table(found)], {
        "file": path, "tokens": len(tokens), "method": "one window, every position scored",
        "reference": "PyTorch eager f32", "rows": llm_report.accuracy_json(found)}


def _file_type(gguf: str | None) -> str:
    """The type of a GGUF file's weights (its general.file_type), e.g. Q4_1."""
    import gguf as gguf_lib

    reader = gguf_lib.GGUFReader(gguf)
    field = reader.fields.get("general.file_type")
    if field is None:
        return "as shipped"
    return gguf_lib.LlamaFileType(int(field.parts[-1][0])).name.removeprefix("MOSTLY_")


def handle(args: argparse.Namespace) -> int:
    formats = parse_quants(args.quant)
    if len(formats) != 1:
        raise TilefoldError(f"--quant {args.quant!r}: give one of none, int8, int4")
    compare = parse_compare(args.compare)
    prepared, config, tokenizer = open_model(args)
    vocab = config.get_text_config().vocab_size
    count_ = args.prompt_tokens or (None if args.prompt is not None else 256)
    prompt = llm_models.prompt_tokens(tokenizer, vocab, args.prompt, count_)
    length = args.max_length or len(prompt) + args.new_tokens
    if length < len(prompt) + args.new_tokens:
        raise TilefoldError(f"--max-length {length}: the prompt's {len(prompt)} tokens and "
                            f"{args.new_tokens} new ones need {len(prompt) + args.new_tokens}")
    header, gbps = host_lines(args.threads)
    if args.profile:
        print("\n".join([*header, *profile_lines(prepared, prompt, args.new_tokens, length,
                                                  formats[0], args.threads)]))
        return 0
    work = Workload(prepared, prompt, args.new_tokens, args.threads, length, args.strict,
                    str(cache_dir() / "llm"))
    activations = llm_runs.resolve_activations(args.activations)
    jobs = llm_runs.jobs_for(formats, compare, prepared, say, activations)
    header.append(f"model: {prepared.source.name} ({prepared.source.kind} {prepared.source.path}"
                  f"), f32 weights{'' if formats == ['f32'] else ' quantized by tilefold'}; "
                  f"prompt {len(prompt)} tokens, {args.new_tokens} new, greedy; "
                  f"{args.threads} thread(s); {args.rounds} timed rounds")
    header += _peer_notes(formats[0], compare)
    say("running " + ", ".join(j.label for j in jobs))
    rows = [llm_report.figures(r, work, gbps)
            for r in llm_runs.generate_all(work, jobs, args.rounds, say)]
    text = llm_models.decode(tokenizer, rows[0]["tokens"])
    lines = [*header, "", f"{rows[0]['label']} generated:", text, "",
             *llm_report.table(rows, args.new_tokens),
             *llm_report.notes(work, gbps, rows[0].get("probed_gbps")),
             "", *llm_report.ratio_lines(rows)]
    data: dict[str, Any] = {"command": "generate", "header": header, "model": prepared.to_json(),
                            "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
                            "threads": args.threads, "max_length": length, "quant": args.quant,
                            "read_bandwidth_gbps": gbps,
                            "probed_bandwidth_gbps": rows[0].get("probed_gbps"), "text": text,
                            "contenders": rows}
    print("\n".join(lines), flush=True)
    if args.perplexity:
        more, data["perplexity"] = accuracy(work, ALL_FORMATS, "llamacpp" in compare
                                            and llm_runs.llama_absent(prepared) is None,
                                            args.perplexity, args.perplexity_tokens, tokenizer,
                                            activations)
        print("\n".join(more))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
        print(f"results written to {args.json}")
    if rows[0]["error"] is not None:
        raise TilefoldError(f"{rows[0]['label']} failed: {rows[0]['error']}")
    return 0


def profile_lines(prepared: llm_models.Prepared, prompt: list[int], new_tokens: int,
                  length: int, fmt: str, threads: int) -> list[str]:
    """A decode step's time by kernel (`GGUFGenerator.profile` where the model is built
    natively, else `Generator.profile`), in this process."""
    say(f"compiling and profiling tilefold {fmt}")
    if native_gguf({"gguf": prepared.gguf}):
        from tilefold.frontend.gguf_generator import GGUFGenerator

        os.environ["TILEFOLD_NUM_THREADS"] = str(threads)
        generator = GGUFGenerator(prepared.gguf, weights=fmt, max_length=length, saved=False)
    else:
        import torch

        from tilefold.frontend.generation import Generator

        torch.set_num_threads(threads)
        model = llm_models.load_model(prepared.kind, prepared.path)
        generator = Generator(model, max_length=length, options={"weights": fmt})
    times = generator.profile(prompt, new_tokens)
    rows = times.per_call()
    total = sum(seconds for _, seconds, _ in rows) or 1.0
    lines = ["", f"tilefold {fmt}: a decode step's {len(rows)} kinds of step, timed one by one "
             f"over {times.calls} steps (one by one, not replayed): {total * 1e3:.2f} ms a token",
             f"{'ms/token':>9} {'share':>6} {'calls':>5}  step"]
    lines += [f"{seconds * 1e3:9.3f} {seconds / total:6.1%} {count:5d}  {label}"
              for label, seconds, count in rows[:25]]
    if len(rows) > 25:
        rest = sum(seconds for _, seconds, _ in rows[25:])
        lines.append(f"{rest * 1e3:9.3f} {rest / total:6.1%}        {len(rows) - 25} more")
    return lines


def _peer_notes(fmt: str, compare: list[str]) -> list[str]:
    notes = []
    if fmt != "f32" and any(c in compare for c in ("eager", "inductor")):
        notes.append("PyTorch eager and inductor run the f32 weights (no weight-only path "
                     "without torchao)")
    if "torchao" in compare and fmt != "f32":
        scheme = ("Int8WeightOnlyConfig, a scale per channel" if fmt == "int8" else
                  "IntxWeightOnlyConfig int4, a scale per 32")
        notes.append(f"torchao {fmt}: the linear layers quantized by torchao ({scheme}), run by "
                     "inductor (static cache) and by tilefold on torchao's codes")
    if "llamacpp" in compare:
        notes.append(f"llama.cpp runs {LLAMA_FOR[fmt]}: the GGUF file requantized by "
                     "llama.cpp (llama_model_quantize), K and V in f16")
    notes.append(llm_runs.onnx_genai_note())
    return notes
