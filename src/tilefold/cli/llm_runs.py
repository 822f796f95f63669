"""Running the contenders of `tilefold generate` and `bench llm`, each in processes of its own:
a cold one (empty tilefold and inductor caches) and a warm one (the caches the cold one filled),
the warm ones' generations timed in turn and then alone, and logits for perplexity.

Every contender gets the same threads (torch, tilefold, OpenMP, BLAS, llama.cpp) and its own
RSS. The children are `python -m tilefold.cli.llm_worker`; a child that fails or crashes (a
llama.cpp build for another CPU dies of SIGILL) becomes that contender's error, not the run's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.cli import llm_metrics
from tilefold.cli.llm_models import Prepared
from tilefold.runtime.timing import SETTLE_SECONDS, Timing, interleaved_medians

# `--compare` names -> worker contenders (`llm_worker.CONTENDERS`).
COMPARE = {"eager": ("hf-eager", "eager"), "inductor": ("hf-inductor", "inductor"),
           "torchao": ("hf-inductor", "tilefold-torch"), "llamacpp": ("llamacpp",),
           "torch": ("tilefold-torch",), "ortgenai": ("ortgenai",)}
QUANTS = {"none": "f32", "int8": "int8", "int4": "int4"}  # --quant -> tilefold's format
LLAMA_FOR = {"f32": "F32", "int8": "Q8_0", "int4": "Q4_0"}  # tilefold's format -> llama.cpp's
LABELS = {"hf-eager": "HF eager generate", "eager": "eager loop",
          "hf-inductor": "inductor generate", "inductor": "inductor loop"}
READY_TIMEOUT_S = 1200  # load + compile + one generation (inductor's cold compile: minutes)
RUN_TIMEOUT_S = 600
LLAMA_BUILD = ('CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python '
               'llama-cpp-python (builds from source, ≈ 12 min on 2 cores)')


@dataclass(frozen=True)
class Job:
    """One contender: a worker key and the precision it runs at (tilefold's format, or a
    llama.cpp file type)."""

    key: str
    quant: str
    name: str = ""  # the label, when the default does not say enough
    torchao: bool = False  # the model quantized by torchao first (weight-only, at `quant`)
    activations: str = "f32"  # tilefold's weight-only GEMMs: "int8" lets them quantize x

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.torchao:
            peer = "inductor" if self.key == "hf-inductor" else "tilefold"
            return f"torchao {self.quant} + {peer}"
        if self.key == "tilefold":
            return f"tilefold {self.quant}" + (" int8-act" if self.activations == "int8" else "")
        if self.key == "tilefold-torch":
            return f"tilefold {self.quant} via torch.compile"
        if self.key == "llamacpp":
            return f"llama.cpp {self.quant}"
        if self.key == "ortgenai":
            return f"ONNX Runtime GenAI {self.quant}"
        return LABELS[self.key]


@dataclass(frozen=True)
class Workload:
    """What every contender runs: the model, the prompt, the new tokens, the threads."""

    model: Prepared
    prompt: list[int]
    new_tokens: int
    threads: int
    max_length: int
    strict: bool = False
    llama_dir: str = ""

    def spec(self, job: Job, mode: str = "generate", **extra: Any) -> dict[str, Any]:
        return {"contender": job.key, "quant": job.quant, "mode": mode, "kind": self.model.kind,
                "path": self.model.path, "gguf": self.model.gguf, "threads": self.threads,
                "max_length": self.max_length, "prompt": self.prompt,
                "new_tokens": self.new_tokens, "strict": self.strict,
                "llama_dir": self.llama_dir, "torchao": job.torchao,
                "activations": job.activations, **extra}


class WorkerFailed(Exception):
    """A child died or reported an error; the message says why."""


def child_env(threads: int, caches: str) -> dict[str, str]:
    """The parent's environment with caches under `caches`, every thread knob at `threads`,
    tilefold importable as the parent imports it, and no TILEFOLD_WEIGHTS (--quant decides)."""
    env = dict(os.environ)
    env.pop("TILEFOLD_WEIGHTS", None)
    src = str(Path(__file__).resolve().parents[2])  # the folder holding this tilefold
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.update({"TILEFOLD_CACHE_DIR": os.path.join(caches, "tilefold"),
                "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "inductor"),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                "TOKENIZERS_PARALLELISM": "false"})
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "TILEFOLD_NUM_THREADS"):
        env[name] = str(threads)
    return env


class Worker:
    """A `python -m tilefold.cli.llm_worker` child and its JSON-lines channel."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str], folder: str, name: str):
        self.spec_path = os.path.join(folder, f"{name}.json")
        self.err_path = os.path.join(folder, f"{name}.err")
        with open(self.spec_path, "w") as f:
            json.dump(spec, f)
        self.started = time.perf_counter()
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tilefold.cli.llm_worker", self.spec_path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env)

    def _why(self) -> str:
        """The child's last words: its error line, else its exit status and stderr's tail."""
        code = self.proc.poll()
        try:
            tail = Path(self.err_path).read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            tail = []
        if code is not None and code < 0:
            import signal

            name = signal.Signals(-code).name
            hint = (f"; a native build runs only on CPUs like the one that built it: {LLAMA_BUILD}"
                    if name == "SIGILL" and self.spec.get("contender") == "llamacpp" else "")
            return f"killed by {name}{hint}"
        return " | ".join(tail) or f"exit status {code}"

    @property
    def spec(self) -> dict[str, Any]:
        with open(self.spec_path) as f:
            return json.load(f)

    def receive(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.kill()
            raise WorkerFailed(f"no answer in {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise WorkerFailed(self._why())
        message = json.loads(line)
        if "error" in message:
            self.proc.wait()
            raise WorkerFailed(message["error"])
        return message

    def ask(self, command: str, timeout: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc.wait()
            raise WorkerFailed(self._why()) from None
        return self.receive(timeout)

    def close(self) -> dict[str, Any]:
        """Ask it to end; its last message (peak RSS), sent after it saved what it compiled
        for the next process (`GGUFGenerator.keep`: compiling the step's other sizes)."""
        final = self.ask("quit", READY_TIMEOUT_S)
        self.proc.wait(timeout=60)
        return final

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Result:
    """What one contender did: its cold and warm processes' first generations, its timed
    generations interleaved with the others and alone, its warm process's RSS, or its error."""

    job: Job
    cold: dict[str, Any] | None = None
    warm: dict[str, Any] | None = None
    cold_s: float | None = None  # the cold process, from its start to its first new token
    interleaved: list[dict[str, Any]] = field(default_factory=list)
    alone: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    error: str | None = None
    probed_gbps: float | None = None  # the read bandwidth probed beside the timed runs

    def timing(self, key: str) -> Timing:
        """Medians of a run's `key` seconds (prefill_s, decode_s), interleaved and alone."""
        return Timing(statistics.median(r[key] for r in self.interleaved),
                      statistics.median(r[key] for r in self.alone))

    @property
    def tokens(self) -> list[int]:
        return (self.warm or self.cold or {}).get("first", {}).get("tokens", [])


def bandwidth_probe(threads: int) -> Callable[[], float]:
    """A probe of the read bandwidth (GB/s) `threads` threads get from memory now, over a
    stream no cache holds any of, its buffer touched once."""
    from tilefold.target import host_target
    from tilefold.target.peaks import ReadProbe, dram_stream_bytes

    return ReadProbe(threads, dram_stream_bytes(host_target().l3_bytes))


def generate_all(work: Workload, jobs: list[Job], rounds: int,
                 say: Callable[[str], None]) -> list[Result]:
    """Every job's cold process, then its warm one (kept), then `rounds` generations of each
    warm one in turn (`interleaved_medians`' order, settling between) and `rounds` alone;
    the read bandwidth is probed in turn with the interleaved runs, and the median of those
    probes is each result's `probed_gbps`: what this run's host gave, on a shared one."""
    results = [Result(job) for job in jobs]
    live: dict[int, Worker] = {}
    with tempfile.TemporaryDirectory(prefix="tilefold-generate-") as tmp:
        try:
            for i, result in enumerate(results):
                env = child_env(work.threads, os.path.join(tmp, f"caches{i}"))
                say(f"  {result.job.label}: cold process, then warm")
                try:
                    cold = Worker(work.spec(result.job), env, tmp, f"cold{i}")
                    try:
                        result.cold = cold.receive(READY_TIMEOUT_S)
                        result.cold_s = (time.perf_counter() - cold.started
                                         - result.cold["first"]["decode_s"])
                        cold.close()
                    finally:
                        cold.kill()
                    live[i] = Worker(work.spec(result.job), env, tmp, f"warm{i}")
                    result.warm = live[i].receive(READY_TIMEOUT_S)
                except WorkerFailed as exc:
                    result.error = str(exc)
                    live.pop(i, None)
            probed = statistics.median(_time_runs(results, live, rounds,
                                                  bandwidth_probe(work.threads)))
            for result in results:
                result.probed_gbps = probed
            for i, worker in list(live.items()):
                try:
                    results[i].final = worker.close()
                except WorkerFailed as exc:
                    results[i].error = str(exc)
        finally:
            for worker in live.values():
                worker.kill()
    return results


def _time_runs(results: list[Result], live: dict[int, Worker], rounds: int,
               probe: Callable[[], float]) -> list[float]:
    """Times `rounds` runs of every live worker interleaved (`probe` taking its turn among
    them), then `rounds` of each alone; the probed bandwidths."""
    probed: list[float] = []

    def probe_sample() -> list[float]:
        probed.append(probe())
        return [0.0]

    def sampler(i: int) -> Callable[[], list[float]]:
        def sample() -> list[float]:
            if results[i].error is None:
                try:
                    results[i].interleaved.append(live[i].ask("run"))
                except WorkerFailed as exc:
                    results[i].error = str(exc)
            return [0.0]
        return sample

    interleaved_medians({"probe": probe_sample, **{str(i): sampler(i) for i in live}}, rounds,
                        lambda run: run(), SETTLE_SECONDS)
    for i, worker in live.items():
        for _ in range(rounds):
            if results[i].error is None:
                try:
                    results[i].alone.append(worker.ask("run"))
                except WorkerFailed as exc:
                    results[i].error = str(exc)
        time.sleep(SETTLE_SECONDS)
    return probed


# ---- perplexity --------------------------------------------------------------------------------

@dataclass
class Accuracy:
    """A contender's perplexity on the text and its agreement with the reference's logits."""

    job: Job
    perplexity: float | None = None
    agreement: llm_metrics.Agreement | None = None
    seconds: float | None = None
    error: str | None = None


def logits_of(work: Workload, job: Job, tokens: list[int], folder: str, name: str
              ) -> tuple[np.ndarray, float]:
    """The job's logits at every position of `tokens` (one forward, in a process of its own)
    and the seconds it took to build and run; WorkerFailed when it fails."""
    out = os.path.join(folder, f"{name}.npy")
    spec = work.spec(job, "logits", tokens=tokens, logits_out=out, max_length=len(tokens))
    worker = Worker(spec, child_env(work.threads, os.path.join(folder, "caches")), folder, name)
    try:
        seconds = worker.receive(READY_TIMEOUT_S)["seconds"]
    finally:
        worker.kill()
    logits = np.load(out)
    os.unlink(out)
    return logits, seconds


def accuracy_all(work: Workload, reference: Job, jobs: list[Job], tokens: list[int],
                 say: Callable[[str], None]) -> list[Accuracy]:
    """Perplexity of `tokens` for the reference and every job, and each job's KL divergence
    from the reference's next-token distributions (one window, every position scored)."""
    found = [Accuracy(job) for job in [reference, *jobs]]
    ref_logits = None
    with tempfile.TemporaryDirectory(prefix="tilefold-perplexity-") as tmp:
        for i, acc in enumerate(found):
            say(f"  {acc.job.label}: logits of {len(tokens)} tokens")
            try:
                logits, acc.seconds = logits_of(work, acc.job, tokens, tmp, f"logits{i}")
            except WorkerFailed as exc:
                acc.error = str(exc)
                continue
            acc.perplexity = llm_metrics.perplexity(logits, tokens)
            if i == 0:
                ref_logits = logits
            elif ref_logits is not None:
                acc.agreement = llm_metrics.agreement(ref_logits, logits, tokens)
    return found


# ---- who runs ----------------------------------------------------------------------------------

def llama_absent(model: Prepared) -> str | None:
    """Why llama.cpp cannot run `model` here, or None when it can."""
    if model.gguf is None:
        return ("llama.cpp runs GGUF files only (--model smollm2, a model with random weights "
                "such as qwen2.5-0.5b-random, or FILE.gguf)")
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed: {LLAMA_BUILD}"
    return None


def torchao_absent(formats: list[str]) -> str | None:
    """Why torchao's weight-only models cannot be compared here, or None."""
    if formats == ["f32"]:
        return "it quantizes weights: run --quant int8 or int4"
    if importlib.util.find_spec("torchao") is None:
        return "not installed (pip install torchao)"
    return None


def ort_genai_absent() -> str | None:
    """Why ONNX Runtime GenAI cannot be compared here, or None."""
    missing = [m for m in ("onnxruntime_genai", "onnx_ir", "onnx")
               if importlib.util.find_spec(m) is None]
    if missing:
        return (f"not installed ({', '.join(missing)}: pip install onnxruntime-genai onnx-ir "
                "onnx)")
    return None


def onnx_genai_note() -> str:
    why = ort_genai_absent()
    if why is not None:
        return f"ONNX Runtime GenAI: {why}, not compared"
    return ("ONNX Runtime GenAI (--compare ortgenai): its model builder's model of the f32 "
            "weights (int4: its own 4-bit blocks of 32), its CPU provider")


def resolve_activations(choice: str) -> str:
    """`--activations auto`: "int8" where the host's weight-only GEMMs have an integer dot
    (VNNI, or AVX2 / AVX512BW `pmaddubsw`), as llama.cpp's Q4_0/Q8_0 paths quantize theirs;
    else "f32". Their kernels then compete with the float ones per GEMM (the cost model)."""
    if choice != "auto":
        return choice
    from tilefold.codegen.llvm.lowp.weight_only import dot_instruction, layout_kind
    from tilefold.target import host_target

    host = host_target()
    lanes, _ = layout_kind("i4", False, host)
    return "int8" if dot_instruction(lanes, host) else "f32"


def jobs_for(formats: list[str], compare: list[str], model: Prepared,
             say: Callable[[str], None], activations: str = "f32") -> list[Job]:
    """tilefold at each of `formats` (its weight-only GEMMs' x at `activations`), then the
    peers `compare` names (PyTorch's once, in f32; llama.cpp at the file type matching each
    format) where they can run."""
    jobs = [Job("tilefold", fmt, activations=activations if fmt != "f32" else "f32")
            for fmt in formats]
    for name in compare:
        if name == "llamacpp":
            why = llama_absent(model)
            if why is not None:
                say(f"llama.cpp not compared: {why}")
                continue
            jobs += [Job("llamacpp", LLAMA_FOR[fmt]) for fmt in formats]
        elif name == "torchao":
            why = torchao_absent(formats)
            if why is not None:
                say(f"torchao not compared: {why}")
                continue
            jobs += [Job(key, fmt, torchao=True) for fmt in formats if fmt != "f32"
                     for key in COMPARE[name]]
        elif name == "ortgenai":
            from tilefold.cli.llm_worker import ORT_GENAI_FOR

            why = ort_genai_absent()
            if why is not None:
                say(f"ONNX Runtime GenAI not compared: {why}")
                continue
            skipped = [fmt for fmt in formats if fmt not in ORT_GENAI_FOR]
            if skipped:
                say(f"ONNX Runtime GenAI not compared at {', '.join(skipped)}: its builder "
                    f"writes {', '.join(ORT_GENAI_FOR)} here")
            jobs += [Job("ortgenai", fmt) for fmt in formats if fmt in ORT_GENAI_FOR]
        elif name == "torch":
            jobs += [Job(key, fmt) for fmt in formats for key in COMPARE[name]]
        else:
            jobs += [Job(key, "f32") for key in COMPARE[name]]
    return jobs
