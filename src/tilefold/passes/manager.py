"""The pass manager: runs a pipeline over a module, verifying and instrumenting each pass.

    pm = PassManager("canonicalize,cse", print_ir_after={"cse"}, stream=sys.stderr)
    pm.run(module)
    print(pm.timing_report(), pm.statistics_report())

After every pass the verifier runs (`verify_each`, on by default), so a pass that breaks the IR
is named in a PassError instead of surfacing later; without it (the JIT, where the verifier
costs a tenth of a warm compile) it runs before the first pass and after the last. IR dumps
carry MLIR's header, `// -----// IR Dump After cse //----- //`. The pipeline syntax is in
`pipeline.py`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TextIO

from tilefold.errors import PassError, TilefoldError, VerificationError
from tilefold.ir import Module, print_module, verify
from tilefold.passes.base import Pass
from tilefold.passes.pipeline import parse_pipeline
from tilefold.passes.registry import PASSES, suggest

log = logging.getLogger("tilefold.passes")

RULE = "===" + "-" * 73 + "==="


class PassManager:
    """An ordered list of pass instances plus how to verify, dump and time them."""

    def __init__(
        self,
        pipeline: str | Iterable[Pass | str] = (),
        *,
        verify_each: bool = True,
        print_ir_before: Collection[str] = (),
        print_ir_after: Collection[str] = (),
        print_ir_before_all: bool = False,
        print_ir_after_all: bool = False,
        stream: TextIO | None = None,
    ):
        self.passes: list[Pass] = []
        self.add(pipeline)
        self.verify_each = verify_each
        self.print_ir_before = _known(print_ir_before, "print_ir_before")
        self.print_ir_after = _known(print_ir_after, "print_ir_after")
        self.print_ir_before_all = print_ir_before_all
        self.print_ir_after_all = print_ir_after_all
        self.stream = stream
        self.times: list[tuple[str, float]] = []  # (label, seconds), accumulated over runs

    def add(self, pipeline: str | Iterable[Pass | str]) -> PassManager:
        """Append passes: a pipeline text, or pass instances and pipeline texts."""
        items = [pipeline] if isinstance(pipeline, str) else pipeline
        for item in items:
            self.passes += parse_pipeline(item) if isinstance(item, str) else [item]
        return self

    def run(self, module: Module) -> Module:
        """Run every pass over `module` in place; return it."""
        self._timed("verifier", verify, module)  # a broken input is not the first pass's fault
        for p in self.passes:
            if self.print_ir_before_all or p.name in self.print_ir_before:
                self._dump(f"Before {p.name}", module)
            log.debug("running %s", p)
            self._run_pass(p, module)
            if self.verify_each:
                self._verify_after(f"pass '{p.name}'", module)
            if self.print_ir_after_all or p.name in self.print_ir_after:
                self._dump(f"After {p.name}", module)
        if not self.verify_each and self.passes:
            names = ",".join(p.name for p in self.passes)
            self._verify_after(
                f"pipeline '{names}' (`tilefold opt --verify-each` names the pass)", module)
        return module

    def _verify_after(self, culprit: str, module: Module) -> None:
        try:
            self._timed("verifier", verify, module)
        except VerificationError as exc:
            raise PassError(f"{culprit} left invalid IR: {exc.message}", exc.loc,
                            exc.source) from None

    def _run_pass(self, p: Pass, module: Module) -> None:
        try:
            self._timed(str(p), p.run, module)
        except PassError:
            raise
        except TilefoldError as exc:
            raise PassError(f"pass '{p.name}' failed: {exc.message}", exc.loc, exc.source) from exc

    def _timed(self, label: str, fn: Callable[[Module], object], module: Module) -> None:
        start = time.perf_counter()
        try:
            fn(module)
        finally:
            self.times.append((label, time.perf_counter() - start))

    def _dump(self, what: str, module: Module) -> None:
        stream = self.stream or sys.stderr
        stream.write(f"// -----// IR Dump {what} //----- //\n{print_module(module)}\n")

    def timing_report(self) -> str:
        """Wall time per pass (in pipeline order) and in the verifier, like `-mlir-timing`."""
        totals: dict[str, float] = {}
        for label, seconds in self.times:
            totals[label] = totals.get(label, 0.0) + seconds
        total = sum(totals.values())
        lines = [
            *_banner("Execution time report"),
            f"  Total Execution Time: {total:.4f} seconds",
            "",
            "  ----Wall Time----  ----Name----",
        ]
        for label, seconds in [*totals.items(), ("Total", total)]:
            share = 100 * seconds / total if total else 0.0
            lines.append(f"  {seconds:8.4f} ({share:5.1f}%)  {label}")
        return "\n".join(lines) + "\n"

    def statistics_report(self) -> str:
        """Each pass's counters, like `-mlir-pass-statistics`."""
        lines = _banner("Pass statistics report")
        for p in self.passes:
            lines.append(f"'{p}'")
            lines += [f"  ({s.name}) {p.stats[s.name]} - {s.doc}" for s in p.statistics]
        return "\n".join(lines) + "\n"


def _banner(title: str) -> list[str]:
    return [RULE, f"{'... ' + title + ' ...':^79}".rstrip(), RULE]


def _known(names: Collection[str], what: str) -> frozenset[str]:
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        name = unknown[0]
        raise PassError(f"{what}: unknown pass '{name}'{suggest(name)}")
    return frozenset(names)


def run_pipeline(module: Module, pipeline: str | Sequence[Pass | str], **options) -> Module:
    """Run a pipeline over `module` in place; `options` are PassManager's keyword arguments."""
    return PassManager(pipeline, **options).run(module)
