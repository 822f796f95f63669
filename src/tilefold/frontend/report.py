"""What the frontend did with each graph (lowered ops, PyTorch fallbacks and why), for explain."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

from tilefold.errors import FallbackError, strict

log = logging.getLogger("tilefold.frontend")


@dataclass
class GraphReport:
    """One graph torch.compile handed to tilefold."""

    graph: str
    mode: str  # "tilefold" (whole graph), "partitioned", or "eager"
    aten_nodes: int = 0
    lowered: dict[str, int] = field(default_factory=dict)  # ATen op -> count run by tilefold
    fallback: dict[str, str] = field(default_factory=dict)  # ATen op -> why PyTorch runs it
    fallback_nodes: int = 0
    partitions: int = 0
    symbolic_dims: list[str] = field(default_factory=list)
    trace_s: float = 0.0
    convert_s: float = 0.0
    reason: str = ""  # why the whole graph runs eagerly, when it does
    cached: bool = False  # the lowering came from the graph cache (no ATen trace)
    # what runs the graph's tilefold parts (`add`), held weakly: the compiled callable owns
    # them, and a report outliving it (after `torch._dynamo.reset()`) keeps no plan alive
    _executors: list[weakref.ref] = field(default_factory=list, repr=False)

    def add(self, executor: Any) -> None:
        """Note an object running a tilefold part (one per partition): it has `executor`,
        groups(), methods() and decisions()."""
        self._executors.append(weakref.ref(executor))

    @property
    def executors(self) -> list[Any]:
        """The graph's executors still alive (all of them while its compiled callable is)."""
        return [e for e in (ref() for ref in self._executors) if e is not None]

    @property
    def executor(self) -> str:
        """What runs the graph's tilefold parts now: "tilefold.compile" or "interpreter" (both,
        comma-separated, when partitions differ); "PyTorch" when tilefold runs none of it;
        "released" once its compiled callable is gone."""
        alive = self.executors
        if self._executors and not alive:
            return "released"
        return ", ".join(sorted({e.executor for e in alive})) or "PyTorch"

    def groups(self) -> list[tuple[str, str]]:
        """(a group's ops joined by "+", the kernel method that ran it) for every group of every
        tilefold part at the last call (ops the interpreter ran have method "interpreter")."""
        return [g for executor in self.executors for g in executor.groups()]

    def methods(self) -> dict[str, int]:
        """Ops per kernel method at the last call (PyTorch's share as `extern (PyTorch)`)."""
        counts: dict[str, int] = {}
        for executor in self.executors:
            for method, n in executor.methods().items():
                counts[method] = counts.get(method, 0) + n
        if self.fallback_nodes:
            counts["extern (PyTorch)"] = self.fallback_nodes
        return counts

    def decisions(self) -> list[Any]:
        """Every fused group's kernel choice (`strategy.Decision`) at the last call."""
        return [d for executor in self.executors for d in executor.decisions()]

    def format(self) -> str:
        head = f"graph {self.graph}: {self.mode}"
        if self.mode == "eager":
            return f"{head} ({self.reason})"
        lines = [
            f"{head}, {self.aten_nodes} ATen nodes, {sum(self.lowered.values())} lowered, "
            f"{self.fallback_nodes} run by PyTorch in {self.partitions} tilefold partition(s); "
            f"executor {self.executor}; "
            + (f"from the graph cache in {self.convert_s:.2f} s" if self.cached else
               f"trace {self.trace_s:.2f} s, lower {self.convert_s:.2f} s"),
        ]
        methods = self.methods()
        if methods:
            listed = ", ".join(f"{k} {v}" for k, v in sorted(methods.items()))
            lines.append(f"  ops by kernel method: {listed}")
        if self.symbolic_dims:
            lines.append(f"  symbolic dims: {', '.join(self.symbolic_dims)}")
        for op, why in sorted(self.fallback.items()):
            lines.append(f"  PyTorch runs {op}: {why}")
        return "\n".join(lines)


REPORTS: list[GraphReport] = []


def record(report: GraphReport) -> GraphReport:
    REPORTS.append(report)
    return report


def explain() -> str:
    """Every graph compiled in this process: what tilefold ran and what it left to PyTorch."""
    if not REPORTS:
        return "no graph compiled with backend='tilefold' yet"
    return "\n".join(r.format() for r in REPORTS)


def reports() -> list[GraphReport]:
    return list(REPORTS)


def left_to_pytorch(report: GraphReport, what: str, exc: Exception, flag: bool | None) -> None:
    """`what` (a graph) could not be lowered because of `exc`: a `FallbackError` in strict mode,
    else `report` says that PyTorch runs it and why, in the log too."""
    if strict(flag):
        raise FallbackError(f"{what} would run in PyTorch: {type(exc).__name__}: {exc}") from exc
    report.mode, report.reason = "eager", f"{type(exc).__name__}: {exc}"
    log.warning("tilefold: %s runs in PyTorch: %s", what, report.reason)
