"""Runs the gradients of PyTorch's OpInfo samples (inputs that require grad) through
torch.compile(backend="tilefold"), strict, and sorts each sample's outcome: both AOTAutograd
graphs (forward and backward) ran in tilefold and the gradients matched, a graph or node was
left to PyTorch (a failure under strict), the gradients mismatched, or it raised.

A sample runs as `loss = sum((out * g).sum())` over its differentiable outputs, `g` random
weights, compiled whole; `torch.autograd.grad(loss, inputs)` then runs the backward graph
AOTAutograd handed to tilefold. Samples are float32, the dtype tilefold generates kernels for
(float64 goes to library calls); the oracle is eager PyTorch in float64 on the same values.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import opinfo_harness as h
import torch
from tolerances import tolerance
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils._pytree import tree_flatten, tree_unflatten

from tilefold.errors import FallbackError
from tilefold.frontend import report

DTYPE = torch.float32
# The default run takes CAP samples of each op, spread evenly over its list (about 170 samples,
# ~0.4 s each: two graphs compiled); TILEFOLD_OPINFO_FULL=1 (the forward suite's switch) all.
CAP = 2
DENYLIST = Path(__file__).with_name("opinfo_grad_denylist.txt")
# How much larger than eager float32's own error (against float64) tilefold's may be, element
# by element, beyond the tolerance rule: tilefold may round on another schedule (a fused
# multiply-add, a reduction in another order) where the problem is ill-conditioned.
EAGER_ERROR_FACTOR = 4.0
LINE = int(os.environ.get("TILEFOLD_OPINFO_LINE", "240"))  # how much of an error to show


@dataclass(frozen=True, repr=False)
class GradCase(h.Case):
    """One OpInfo entry whose op PyTorch differentiates in float32."""

    def samples(self) -> list[SampleInput]:
        torch.manual_seed(0)
        random.seed(0)
        return list(self.info.sample_inputs("cpu", self.dtype, requires_grad=True))

    def cap(self) -> int:
        return CAP


def grad_cases() -> list[GradCase]:
    """One case per lowered OpInfo entry that supports autograd in float32 on CPU."""
    found: dict[int, GradCase] = {}
    for case in h.cases():
        info = case.info
        if (id(info) not in found and info.supports_autograd
                and DTYPE in info.supported_backward_dtypes("cpu")):
            found[id(info)] = GradCase(info, DTYPE)
    return list(found.values())


# -- one sample -----------------------------------------------------------------------------


@dataclass
class Prepared:
    """A sample as a function of its tensors: `loss(*tensors, *weights)`; which of the tensors
    are differentiated (`wrt`); the weights of the outputs."""

    loss: Any
    tensors: list[torch.Tensor]
    wrt: list[int]
    weights: list[torch.Tensor]


def prepare(case: GradCase, sample: SampleInput) -> Prepared | None:
    """The sample's loss function and its inputs, or None where no float output depends on an
    input that requires grad (nothing to differentiate)."""
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i].detach() for i in slots]
    wrt = [n for n, i in enumerate(slots) if leaves[i].requires_grad
           and leaves[i].is_floating_point()]
    op = h.callable_of(case.info)
    process = sample.output_process_fn_grad

    def outputs(*inputs: torch.Tensor) -> list[torch.Tensor]:
        filled = list(leaves)
        for i, t in zip(slots, inputs, strict=True):
            filled[i] = t
        x, args, kwargs = tree_unflatten(filled, spec)
        flat, _ = tree_flatten(process(op(x, *args, **kwargs)))
        return [t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]

    if not wrt:
        return None
    torch.manual_seed(0)
    probe = outputs(*_leaves(tensors, wrt, torch.float64))
    shapes = [o.shape for o in probe if o.requires_grad]
    if not shapes:
        return None
    gen = torch.Generator().manual_seed(1234)
    weights = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]

    def loss(*args: torch.Tensor) -> torch.Tensor:
        outs = [o for o in outputs(*args[:len(tensors)]) if o.requires_grad]
        return sum((o * g).sum() for o, g in zip(outs, args[len(tensors):], strict=True))

    return Prepared(loss, tensors, wrt, weights)


def _leaves(tensors: list[torch.Tensor], wrt: list[int], dtype: torch.dtype) -> list:
    """Fresh leaves: the float tensors in `dtype`, those in `wrt` requiring grad."""
    out = []
    for n, t in enumerate(tensors):
        t = t.to(dtype) if t.is_floating_point() else t
        out.append(t.detach().clone().requires_grad_(n in wrt))
    return out


def _grads(fn: Any, p: Prepared, dtype: torch.dtype, seed: int = 0) -> list:
    """(loss, gradients of the `wrt` tensors) of `fn` at dtype; None for an unreached input."""
    inputs = _leaves(p.tensors, p.wrt, dtype)
    torch.manual_seed(seed)
    value = fn(*inputs, *(g.to(dtype) for g in p.weights))
    grads = torch.autograd.grad(value, [inputs[n] for n in p.wrt], allow_unused=True)
    return [value.detach(), *(None if g is None else g.detach() for g in grads)]


def run_grad_sample(case: GradCase, sample: SampleInput) -> h.Outcome:
    """The sample's loss and its gradients compiled strict, against eager float64."""
    p = prepare(case, sample)
    if p is None:
        return h.Outcome("skipped", "no float output depends on an input requiring grad")
    want = _grads(p.loss, p, torch.float64)
    if case.info.name in h.UNINITIALIZED or not _same(_grads(p.loss, p, torch.float64, 1),
                                                       want):
        return h.Outcome("random", "output drawn from the RNG: gradients not compared")
    eager = _grads(p.loss, p, DTYPE)
    torch._dynamo.reset()
    report.REPORTS.clear()
    compiled = torch.compile(p.loss, backend="tilefold", options={"strict": True})
    try:
        got = _grads(compiled, p, DTYPE)
    except Exception as exc:
        cause = getattr(exc, "inner_exception", None) or exc  # BackendCompilerFailed's
        kind = "fallback" if isinstance(cause, FallbackError) else "error"
        return h.Outcome(kind, h._one_line(f"{type(cause).__name__}: {cause}", LINE))
    reduced = max([t.numel() for t in p.tensors] + [1]) + max(g.numel() for g in p.weights)
    problem = compare(got, want, eager, reduced)
    if problem:
        return h.Outcome("mismatch", problem)
    graphs = report.reports()
    parts = {g.graph.rsplit(" ", 1)[-1] for g in graphs}
    if "backward" not in parts:
        return h.Outcome("fallback", "no backward graph reached tilefold: "
                         + (", ".join(sorted(g.graph for g in graphs)) or "no graph at all"))
    return h._where_it_ran(graphs)


def _same(a: list, b: list) -> bool:
    return all((x is None) == (y is None) and (x is None or torch.equal(x, y))
               for x, y in zip(a, b, strict=True))


def compare(got: list, want: list, eager: list, reduced: int) -> str:
    """'' when every result is within `tolerances.py`'s float32 rule for sums of `reduced`
    terms of the size of the largest gradient element (the backward pass sums terms that
    large), plus EAGER_ERROR_FACTOR times eager float32's own error at that element; else
    what is off. `reduced` bounds the length of any sum a gradient element passes through:
    the forward's (at most an input's size) and the backward's over the outputs (at most
    their size)."""
    eps = tolerance("f32", reduced)["rtol"]
    names = ["loss"] + [f"grad {i}" for i in range(len(got) - 1)]
    scale = max([float(w.abs().max()) for w in want[1:] if w is not None and w.numel()] + [1.0])
    for name, g, w, e in zip(names, got, want, eager, strict=True):
        if w is None or e is None:  # eager's autograd did not reach this input
            if g is not None and bool(g.any()):
                return f"{name}: nonzero gradient for an input eager does not reach"
            continue
        if g is None:
            return f"{name}: no gradient"
        if g.shape != w.shape or g.dtype != e.dtype:
            return f"{name}: {g.dtype}{list(g.shape)}, expected {e.dtype}{list(w.shape)}"
        g64, w64, e64 = (t.double().numpy() for t in (g, w, e))
        with np.errstate(invalid="ignore"):
            bound = eps * (np.abs(w64) + (1.0 if name == "loss" else scale))
            bound = bound + EAGER_ERROR_FACTOR * np.nan_to_num(np.abs(e64 - w64))
            error = np.abs(g64 - w64)
        exact = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
        ok = np.where(np.isfinite(w64) & np.isfinite(e64), error <= bound,
                      exact | ~np.isfinite(e64) & ~np.isfinite(g64))
        if not ok.all():
            worst = np.unravel_index(np.argmax(np.where(ok, -1.0, np.nan_to_num(
                error, nan=np.inf))), ok.shape)
            return (f"{name}: {(~ok).sum()} of {ok.size} elements off (sums of {reduced}); "
                    f"worst at {tuple(map(int, worst))}: got {float(g64[worst])!r}, float64 "
                    f"{float(w64[worst])!r}, eager float32 {float(e64[worst])!r}, allowed "
                    f"{float(np.broadcast_to(bound, ok.shape)[worst]):.3g}")
    return ""


# -- the denylist ---------------------------------------------------------------------------


def read_denylist(path: Path = DENYLIST) -> dict[tuple[str, str, int], h.Entry]:
    """The allowlist's format: `op | dtype | index | inputs | reason` lines."""
    return h.read_allowlist(path)


def regenerate() -> Any:
    """The denylist for every sample that is not native now (as `opinfo_harness.regenerate`).
    `python tests/frontend/opinfo_grad_harness.py > tests/frontend/opinfo_grad_denylist.txt`"""
    old = read_denylist()
    yield from (ln for ln in DENYLIST.read_text().splitlines() if ln.startswith("#"))
    for case in grad_cases():
        samples = case.samples()
        for index in case.picked(len(samples)):
            outcome = run_grad_sample(case, samples[index])
            if outcome.kind not in OK_KINDS:
                kept = old.get((case.op, case.dtype_name, index))
                reason = kept.reason if kept else f"{outcome.kind}: {outcome.detail}"
                yield h.format_entry(case, index, h.describe(samples[index], case.dtype), reason)


# -- the summary ----------------------------------------------------------------------------


RESULTS: dict[str, h.Tally] = {}  # "op-dtype" -> tally, filled by the tests, read by summary()


def summary() -> Any:
    """The table CI prints: per op, samples by outcome, then the native share overall."""
    kinds = ("tilefold", "fallback", "mismatch", "error", "random", "skipped")
    head = ("op-dtype", "samples", *kinds, "denied")
    rows, totals = [head], h.Tally()
    for key in sorted(RESULTS):
        t = RESULTS[key]
        rows.append((key, str(t.total), *(str(t.counts.get(k, 0)) for k in kinds),
                     str(t.allowlisted)))
        for kind, n in t.counts.items():
            totals.counts[kind] = totals.counts.get(kind, 0) + n
        totals.allowlisted += t.allowlisted
    rows.append(("overall", str(totals.total), *(str(totals.counts.get(k, 0)) for k in kinds),
                 str(totals.allowlisted)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        yield "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    native, compared = native_share(RESULTS.values())
    yield (f"native: {native} of {compared} samples with a gradient to compare ran forward and "
           f"backward in tilefold ({100 * native / max(compared, 1):.1f}%); denied: failed "
           "and in the denylist")


def native_share(tallies: Any) -> tuple[int, int]:
    """(samples run native, samples with a gradient to compare) over tallies."""
    native = compared = 0
    for t in tallies:
        native += t.counts.get("tilefold", 0)
        compared += t.total - t.counts.get("skipped", 0) - t.counts.get("random", 0)
    return native, compared


# Outcomes that pass strict: ran in tilefold, or nothing to compare (no differentiable output,
# or RNG output). "tilefold", "random" and "skipped" samples count; the rest must be denylisted.
OK_KINDS = ("tilefold", "random", "skipped")


if __name__ == "__main__":
    os.environ["TILEFOLD_GRAPH_CACHE"] = "0"
    for line in regenerate():
        print(line, flush=True)
