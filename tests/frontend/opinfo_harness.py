"""Runs PyTorch's OpInfo samples of the ATen ops tilefold lowers through torch.compile and sorts
each sample's outcome: matched in tilefold, fell back to PyTorch, mismatched, or raised."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import OpInfo, SampleInput
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from tilefold.frontend import report
from tilefold.frontend.lowering import RULES
from tilefold.frontend.tensors import DTYPES as FRONTEND_DTYPES

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# An OpInfo supporting none of FLOATS (the bitwise ops) runs in these instead.
NON_FLOATS = (torch.bool, torch.int64)
# The default run takes CAP samples of each op and dtype, spread evenly over its list (about 490
# samples, ~0.5 s each); TILEFOLD_OPINFO_FULL=1 takes all (about 2900).
CAP = {torch.float32: 3}
CAP_OTHER = 1
FULL = os.environ.get("TILEFOLD_OPINFO_FULL") == "1"
ALLOWLIST = Path(__file__).with_name("opinfo_allowlist.txt")

# The one place tolerances leave PyTorch's dtype defaults (assert_close's rtol, atol):
# - ops that accumulate (reductions, normalizations, matrix products) in bf16/f16. Both sides
#   accumulate in f32 but round on their own schedules (tilefold rounds a product before adding
#   the bias, eager rounds once), so they differ by up to a unit in the last place;
# - f32 attention: PyTorch's own OpInfo tests allow it atol 5e-5, rtol 5e-6 (against float64,
#   eager and tilefold are both off by up to 1.7e-5 on these samples).
ACCUMULATING = {"sum", "mean", "linalg.vector_norm", "softmax", "log_softmax",
                "nn.functional.layer_norm", "native_layer_norm", "nn.functional.rms_norm",
                "mm", "bmm", "addmm", "matmul", "nn.functional.linear",
                "nn.functional.scaled_dot_product_attention"}
LOW_PRECISION_ACCUMULATION = {torch.bfloat16: (3.2e-2, 1e-2), torch.float16: (4e-3, 1e-3)}
OVERRIDES = {("nn.functional.scaled_dot_product_attention", torch.float32): (5e-6, 5e-5)}


def tolerance(name: str, dtype: torch.dtype) -> dict[str, float]:
    """assert_close's rtol and atol for an OpInfo (by name) in a dtype; {} for the defaults."""
    found = OVERRIDES.get((name, dtype))
    if found is None and name in ACCUMULATING:
        found = LOW_PRECISION_ACCUMULATION.get(dtype)
    return {} if found is None else {"rtol": found[0], "atol": found[1]}


# -- which OpInfos --------------------------------------------------------------------------


def lowered_packets() -> set[Any]:
    """The ATen overload packets with at least one lowering rule (read from the rule tables)."""
    return {t.overloadpacket for t in RULES
            if isinstance(t, torch._ops.OpOverload) and t.namespace == "aten"}


def aten_packet(info: OpInfo) -> Any:
    """The ATen packet an OpInfo's op names (by aten_name, name, or nn.functional's name)."""
    for name in (info.aten_name, info.name, info.name.removeprefix("nn.functional.")):
        if name and "." not in name:
            packet = getattr(torch.ops.aten, name, None)
            if packet is not None:
                return packet
    return None


@dataclass(frozen=True, repr=False)
class Case:
    """One OpInfo entry in one dtype."""

    info: OpInfo
    dtype: torch.dtype

    @property
    def op(self) -> str:
        variant = self.info.variant_test_name
        return f"{self.info.name}.{variant}" if variant else self.info.name

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def __str__(self) -> str:
        return f"{self.op}-{self.dtype_name}"

    __repr__ = __str__

    def samples(self) -> list[SampleInput]:
        """Every sample, generated from fixed seeds (the order and values are stable)."""
        torch.manual_seed(0)
        random.seed(0)
        return list(self.info.sample_inputs("cpu", self.dtype))

    def cap(self) -> int:
        """How many samples of this case a default run takes."""
        return CAP.get(self.dtype, CAP_OTHER)

    def picked(self, n: int) -> list[int]:
        """Which of n samples run: all, or CAP of them at the midpoints of equal stretches."""
        cap = self.cap()
        if FULL or n <= cap:
            return list(range(n))
        return [(2 * i + 1) * n // (2 * cap) for i in range(cap)]


def cases() -> list[Case]:
    """Every plain op_db entry whose ATen op has a rule, in each dtype tilefold takes for it."""
    lowered = lowered_packets()
    found = []
    for info in op_db:
        if aten_packet(info) not in lowered:
            continue
        supported = info.supported_dtypes("cpu")
        dtypes = [d for d in FLOATS if d in supported] or [d for d in NON_FLOATS if d in supported]
        found += [Case(info, d) for d in dtypes if d in FRONTEND_DTYPES]
    return found


def dynamic_cases() -> list[Case]:
    """One case per OpInfo, in its first dtype (float32 where it has it), for the
    `dynamic=True` run."""
    first: dict[int, Case] = {}
    for case in cases():
        first.setdefault(id(case.info), case)
    return list(first.values())


def dynamic_picked(case: Case, samples: list[SampleInput]) -> list[int]:
    """Which samples run under dynamic=True: all with TILEFOLD_OPINFO_FULL=1, else the one with
    the most dims Dynamo makes symbolic (sizes 0 and 1 stay static), the first among equals."""
    if FULL:
        return list(range(len(samples)))

    def symbolic_dims(sample: SampleInput) -> int:
        leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
        return sum(d > 1 for t in leaves if isinstance(t, torch.Tensor) for d in t.shape)

    return [max(range(len(samples)), key=lambda i: (symbolic_dims(samples[i]), -i))]


def uncovered() -> list[str]:
    """Lowered ATen packets no op_db entry names (tested elsewhere or not at all)."""
    named = {aten_packet(info) for info in op_db}
    return sorted(str(p) for p in lowered_packets() - named)


# -- one sample -----------------------------------------------------------------------------


def describe(sample: SampleInput, dtype: torch.dtype) -> str:
    """A short, stable text of a sample's arguments: shapes for tensors, reprs for the rest."""
    parts = [_brief(sample.input, dtype), *(_brief(a, dtype) for a in sample.args)]
    parts += [f"{k}={_brief(v, dtype)}" for k, v in sample.kwargs.items()]
    return " ".join(parts)


def _brief(value: Any, dtype: torch.dtype) -> str:
    if isinstance(value, torch.Tensor):
        prefix = "" if value.dtype == dtype else str(value.dtype).removeprefix("torch.")
        suffix = "" if value.is_contiguous() else "nc"
        return f"{prefix}[{','.join(map(str, value.shape))}]{suffix}"
    if isinstance(value, list | tuple):
        inner = ",".join(_brief(v, dtype) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return re.sub(r"\s+", "", repr(value))


@dataclass(frozen=True)
class Outcome:
    """What happened to one sample: `kind` is one of KINDS; `detail` says why or how."""

    kind: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in ("interpreter", "mismatch", "error")


KINDS = ("tilefold", "interpreter", "fallback", "random", "mismatch", "error")
# Ops whose values are undefined (uninitialized memory): eager's may repeat between two calls,
# so `run_sample` cannot tell them from deterministic ones; like RNG output, only shapes and
# dtypes compare.
UNINITIALIZED = {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                 "new_empty_strided"}


def run_sample(case: Case, sample: SampleInput, dynamic: bool = False) -> Outcome:
    """The sample through torch.compile(backend="tilefold"), compared with eager PyTorch;
    `dynamic`: every dim Dynamo may make symbolic is (`torch.compile(dynamic=True)`)."""
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i].detach() for i in slots]
    op = callable_of(case.info)

    def call(*inputs: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, t in zip(slots, inputs, strict=True):
            filled[i] = t
        x, args, kwargs = tree_unflatten(filled, spec)
        return op(x, *args, **kwargs)

    with torch.no_grad():
        want = _seeded(call, tensors, 0)
        random_output = (case.info.name in UNINITIALIZED
                         or not _close(_seeded(call, tensors, 1), want, {}))
        torch._dynamo.reset()
        report.REPORTS.clear()
        # Not strict: leaving an op to PyTorch is the rule of the game here; the interpreter
        # taking over a compiled graph still counts as a failure (`Outcome.failed`).
        compiled = torch.compile(call, backend="tilefold", dynamic=dynamic,
                                 options={"strict": False})
        try:
            got = _seeded(compiled, tensors, 0)
        except Exception as exc:  # the rule of the game: tilefold falls back, never raises
            cause = getattr(exc, "inner_exception", None) or exc  # BackendCompilerFailed's
            return Outcome("error", _one_line(f"{type(cause).__name__}: {cause}"))
    if random_output:  # RNG draws (eager and compiled draw differently) or undefined values
        if _meta(got) != _meta(want):
            return Outcome("mismatch", f"random output {_meta(got)}, eager {_meta(want)}")
        return Outcome("random", "output drawn from the RNG or uninitialized: only shapes and "
                                 "dtypes compared")
    try:
        torch.testing.assert_close(got, want, equal_nan=True,
                                   **tolerance(case.info.name, case.dtype))
    except AssertionError as exc:
        return Outcome("mismatch", _mismatch(str(exc)))
    return _where_it_ran(report.reports())


def callable_of(info: OpInfo) -> Any:
    """The OpInfo's op, or the function it wraps in `wrapper_set_seed` (which resets the RNG in
    a context manager that makes Dynamo hand no graph to the backend; the caller seeds instead)."""
    code = getattr(info.op, "__code__", None)
    if code is None or "wrapper_set_seed" not in code.co_names:
        return info.op
    target: Any = torch
    for part in info.name.split("."):
        target = getattr(target, part, None)
    return target if callable(target) else info.op


def _seeded(fn: Any, tensors: list[torch.Tensor], seed: int) -> Any:
    torch.manual_seed(seed)
    return fn(*tensors)


def _meta(value: Any) -> Any:
    return tree_map(lambda t: (t.shape, t.dtype) if isinstance(t, torch.Tensor) else t, value)


def _close(a: Any, b: Any, tol: dict[str, float]) -> bool:
    try:
        torch.testing.assert_close(a, b, equal_nan=True, **tol)
    except AssertionError:
        return False
    return True


def _where_it_ran(graphs: list[report.GraphReport]) -> Outcome:
    if not graphs:
        return Outcome("fallback", "Dynamo handed no graph to the backend")
    reasons = []
    for g in graphs:
        if g.mode == "eager":
            reasons.append(f"graph runs in PyTorch: {g.reason}")
        reasons += [f"PyTorch runs {op}: {why}" for op, why in sorted(g.fallback.items())]
    if reasons:
        return Outcome("fallback", _one_line("; ".join(reasons)))
    if any("interpreter" in g.methods() for g in graphs):
        return Outcome("interpreter", "tilefold.compile failed; the reference interpreter ran")
    return Outcome("tilefold")


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _mismatch(message: str) -> str:
    """assert_close's message, kept to what locates the difference."""
    keep = [ln.strip() for ln in message.splitlines()
            if ln.strip() and not ln.strip().startswith(("(", "The failure occurred"))]
    return _one_line("; ".join(keep), 300)


# -- the allowlist --------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One allowlisted sample: op, dtype, sample index, its described inputs, and why."""

    op: str
    dtype: str
    index: int
    inputs: str
    reason: str
    line: int


def read_allowlist(path: Path = ALLOWLIST) -> dict[tuple[str, str, int], Entry]:
    """`op | dtype | index | inputs | reason` lines; '#' starts a comment line."""
    entries: dict[tuple[str, str, int], Entry] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in raw.split("|", 4)]
        if len(fields) != 5 or not fields[2].isdigit() or not fields[4]:
            raise ValueError(f"{path.name}:{n}: expected 'op | dtype | index | inputs | reason'")
        entry = Entry(fields[0], fields[1], int(fields[2]), fields[3], fields[4], n)
        key = (entry.op, entry.dtype, entry.index)
        if key in entries:
            raise ValueError(f"{path.name}:{n}: a second entry for {key}")
        entries[key] = entry
    return entries


def format_entry(case: Case, index: int, inputs: str, reason: str) -> str:
    return f"{case.op} | {case.dtype_name} | {index} | {inputs} | {reason}"


def regenerate() -> Iterator[str]:
    """The allowlist for every sample that fails now, and the flaky entries: the header and the
    reasons of entries that stay are kept, a new failure's reason is its outcome (to be edited).
    `python tests/frontend/opinfo_harness.py > tests/frontend/opinfo_allowlist.txt`"""
    old = read_allowlist()
    yield from (ln for ln in ALLOWLIST.read_text().splitlines() if ln.startswith("#"))
    for case in cases():
        for index, sample in enumerate(case.samples()):
            kept = old.get((case.op, case.dtype_name, index))
            flaky = kept is not None and kept.reason.startswith("flaky")
            outcome = run_sample(case, sample)
            if outcome.failed or flaky:
                reason = kept.reason if kept else f"{outcome.kind}: {outcome.detail}"
                yield format_entry(case, index, describe(sample, case.dtype), reason)


# -- the summary ----------------------------------------------------------------------------


@dataclass
class Tally:
    """Per op and dtype: counts by outcome kind, and the fallback reasons seen."""

    counts: dict[str, int] = field(default_factory=dict)
    allowlisted: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # fallback reason -> samples

    def add(self, outcome: Outcome, allowlisted: bool) -> None:
        self.counts[outcome.kind] = self.counts.get(outcome.kind, 0) + 1
        self.allowlisted += allowlisted and outcome.failed
        if outcome.kind == "fallback":
            self.reasons[outcome.detail] = self.reasons.get(outcome.detail, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


RESULTS: dict[str, Tally] = {}  # "op-dtype" -> tally, filled by the tests, read by the summary


def summary() -> Iterator[str]:
    """The table CI prints (per op and dtype, then overall), then why samples fell back."""
    head = ("op-dtype", "samples", "tilefold", "interp", "fallback", "random", "allowed",
            "failed", "pass")
    rows = [head]
    totals = Tally()
    for key in sorted(RESULTS):
        t = RESULTS[key]
        rows.append(_row(key, t))
        for kind, n in t.counts.items():
            totals.counts[kind] = totals.counts.get(kind, 0) + n
        totals.allowlisted += t.allowlisted
    rows.append(_row("overall", totals))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        yield "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    yield ("pass: matched eager, in tilefold or after falling back; interp: tilefold's reference "
           "interpreter ran (tilefold.compile failed); random: RNG or uninitialized output, "
           "shapes compared; "
           "allowed: failed but allowlisted; failed: failed and not allowlisted")
    yield "why samples fell back to PyTorch:"
    for key in sorted(RESULTS):
        for why, n in sorted(RESULTS[key].reasons.items()):
            yield f"  {key}: {n} x {why}"
    if uncovered():
        yield "lowered ATen ops with no OpInfo entry: " + ", ".join(uncovered())


def _row(key: str, t: Tally) -> tuple[str, ...]:
    c = t.counts
    failed = c.get("mismatch", 0) + c.get("error", 0)
    passed = t.total - failed
    rate = f"{100 * passed / t.total:.0f}%" if t.total else "-"
    return (key, str(t.total), *(str(c.get(k, 0)) for k in ("tilefold", "interpreter",
            "fallback", "random")), str(t.allowlisted), str(failed - t.allowlisted), rate)


if __name__ == "__main__":
    os.environ["TILEFOLD_GRAPH_CACHE"] = "0"
    for line in regenerate():
        print(line, flush=True)
