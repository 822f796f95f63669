"""The `opt` driver, like mlir-opt: parse IR, run a pipeline, print IR. One implementation serves
`python -m tilefold.passes` and `tilefold opt` (which calls `main` or `add_arguments`/`run`).

    python -m tilefold.passes model.tfir -p default --print-ir-after-all
    python -m tilefold.passes tests.tfir --split-input-file --verify-diagnostics

Exit status: 0 on success, 1 when the input, the pipeline or a check fails (the message says
where and why), 2 for bad command-line usage.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from tilefold.errors import TilefoldError
from tilefold.ir import Module, parse_module, print_module, verify
from tilefold.ir.parser import decode_source, read_source
from tilefold.passes.diagnostics import check, expected_errors
from tilefold.passes.manager import PassManager
from tilefold.passes.registry import PASSES, PIPELINES

SPLIT_MARKER = "// -----"
_SPLIT = re.compile(r"^// -----.*$", re.MULTILINE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The driver's flags, for a parser of its own or a `tilefold opt` subcommand."""
    parser.add_argument("input", nargs="?", default="-", help="IR file ('-' for stdin)")
    parser.add_argument(
        "-p",
        "--pass-pipeline",
        default="",
        metavar="PIPELINE",
        help="passes to run, e.g. 'canonicalize,cse' or 'shape-inference{bind=batch=8},default'",
    )
    parser.add_argument("-o", "--output", default="-", help="output file ('-' for stdout)")
    parser.add_argument(
        "--split-input-file",
        action="store_true",
        help=f"process each '{SPLIT_MARKER}'-separated chunk on its own",
    )
    parser.add_argument(
        "--verify-diagnostics",
        action="store_true",
        help="check errors against '// expected-error @+1 {{text}}' comments",
    )
    parser.add_argument(
        "--verify-roundtrip",
        action="store_true",
        help="check that the output parses and prints back identically",
    )
    parser.add_argument(
        "--verify-each",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the verifier after every pass (default: on)",
    )
    parser.add_argument(
        "--print-ir-before",
        action="append",
        default=[],
        metavar="PASSES",
        help="print the IR before these passes (comma-separated)",
    )
    parser.add_argument(
        "--print-ir-after",
        action="append",
        default=[],
        metavar="PASSES",
        help="print the IR after these passes (comma-separated)",
    )
    parser.add_argument(
        "--print-ir-before-all", action="store_true", help="print the IR before every pass"
    )
    parser.add_argument(
        "--print-ir-after-all", action="store_true", help="print the IR after every pass"
    )
    parser.add_argument(
        "--timing", action="store_true", help="report the wall time of each pass (to stderr)"
    )
    parser.add_argument(
        "--pass-statistics", action="store_true", help="report each pass's statistics (to stderr)"
    )
    parser.add_argument(
        "--resource-dir",
        metavar="DIR",
        help="where 'dense<... file>' constants live (default: next to input)",
    )
    parser.add_argument(
        "--list-passes",
        action="store_true",
        help="list the passes, their options and the named pipelines",
    )
    parser.add_argument(
        "--debug", action="store_true", help="log what the passes do and show tracebacks"
    )


def main(argv: Sequence[str] | None = None, prog: str = "python -m tilefold.passes") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Carry out parsed arguments; returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.list_passes:
        out.write(list_passes())
        return 0
    with _debug_log(err) if args.debug else contextlib.nullcontext():
        try:
            return Driver(args, err).run(out)
        except TilefoldError as exc:
            if args.debug:
                traceback.print_exc(file=err)
            err.write(f"{_render(exc)}\n")
            return 1


@contextlib.contextmanager
def _debug_log(stream: TextIO) -> Iterator[None]:
    """Log what the passes do to `stream` for the duration of one run."""
    logger = logging.getLogger("tilefold.passes")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class Driver:
    """Processes the input chunk by chunk with one pass manager (so reports add up)."""

    def __init__(self, args: argparse.Namespace, err: TextIO):
        self.args = args
        self.err = err
        self.pm = PassManager(
            args.pass_pipeline,
            verify_each=args.verify_each,
            print_ir_before=_names(args.print_ir_before),
            print_ir_after=_names(args.print_ir_after),
            print_ir_before_all=args.print_ir_before_all,
            print_ir_after_all=args.print_ir_after_all,
            stream=err,
        )

    def run(self, out: TextIO) -> int:
        args = self.args
        file = "<stdin>" if args.input == "-" else args.input
        text = _read_stdin() if args.input == "-" else read_source(args.input)
        chunks = split_input(text) if args.split_input_file else [text]
        outputs, failed = [], False
        for chunk in chunks:
            if args.verify_diagnostics:
                output, problems = self.diagnose(chunk, file)
            else:
                output, problems = self.process(chunk, file), []
            for problem in problems:
                self.err.write(problem + "\n")
            failed |= bool(problems)
            if output is not None:
                outputs.append(output)
        self.write(f"{SPLIT_MARKER}\n".join(outputs), out)
        if args.timing:
            self.err.write(self.pm.timing_report())
        if args.pass_statistics:
            self.err.write(self.pm.statistics_report())
        return 1 if failed else 0

    def process(self, text: str, file: str) -> str:
        """The chunk parsed, verified, run through the pipeline and printed."""
        module = parse_module(text, file, self.resource_dir())
        verify(module)
        self.pm.run(module)
        printed = print_module(module)
        if self.args.verify_roundtrip:
            roundtrip(printed, file)
        return printed

    def diagnose(self, text: str, file: str) -> tuple[str | None, list[str]]:
        """The chunk's output (None if it failed) and how its errors differ from those expected."""
        try:
            output, error = self.process(text, file), None
        except TilefoldError as exc:
            output, error = None, exc
        return output, check(file, expected_errors(text), error)

    def resource_dir(self) -> Path:
        if self.args.resource_dir is not None:
            return Path(self.args.resource_dir)
        return Path(self.args.input).parent if self.args.input != "-" else Path.cwd()

    def write(self, text: str, out: TextIO) -> None:
        if self.args.output == "-":
            out.write(text)
            out.flush()  # keep the order of output and reports when both go to one pipe
        else:
            try:
                Path(self.args.output).write_text(text)
            except OSError as exc:
                raise TilefoldError(f"cannot write {self.args.output}: {exc.strerror}") from None


def split_input(text: str) -> list[str]:
    """The chunks between `// -----` lines, each padded with blank lines so that line numbers
    in diagnostics are those of the whole file."""
    chunks, start, line = [], 0, 0
    for m in _SPLIT.finditer(text):
        chunks.append("\n" * line + text[start : m.start()])
        line += text.count("\n", start, m.end()) + 1
        start = m.end() + 1
    chunks.append("\n" * line + text[start:])
    return chunks


def roundtrip(printed: str, file: str) -> None:
    """Raise unless `printed` parses to a module that prints identically and verifies."""
    module: Module = parse_module(printed, f"{file} (printed)")
    again = print_module(module)
    if again != printed:
        diff = difflib.unified_diff(
            printed.splitlines(), again.splitlines(), "printed", "reprinted", lineterm=""
        )
        raise TilefoldError("print -> parse -> print changed the IR:\n" + "\n".join(diff))
    verify(module)


def list_passes() -> str:
    lines = ["Passes:"]
    for name, cls in sorted(PASSES.items()):
        lines.append(f"  {name:<18}{cls.summary}")
        for o in cls.options:
            spelled = f"{o.name}=<{o.metavar}>"
            lines.append(f"      {spelled:<28}{o.doc} (default: {o.format(o.default) or '{}'})")
        if cls.statistics:
            lines.append(f"      statistics: {', '.join(s.name for s in cls.statistics)}")
    lines.append("Pipelines:")
    lines += [f"  {name:<18}{text}" for name, text in sorted(PIPELINES.items())]
    return "\n".join(lines) + "\n"


def _names(values: list[str]) -> set[str]:
    return {n.strip() for v in values for n in v.split(",") if n.strip()}


def _read_stdin() -> str:
    binary = getattr(sys.stdin, "buffer", None)  # absent when a test puts a StringIO there
    return sys.stdin.read() if binary is None else decode_source(binary.read(), "<stdin>")


def _render(exc: TilefoldError) -> str:
    text = str(exc)
    return text if exc.loc is not None else f"error: {text}"
