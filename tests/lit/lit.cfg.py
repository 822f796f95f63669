"""lit configuration for tilefold's IR tests: run with `lit tests/lit -v`.

Substitutions:
  %opt        the opt driver, `python -m tilefold.passes` (`tilefold opt` runs the same code)
  %dist-opt   the same driver with the distributed passes, `python -m tilefold.distributed`
  FileCheck   the `filecheck` package from PyPI, LLVM FileCheck's Python clone
"""

# ruff: noqa: F821 - lit provides `config`

import os
import sys
from pathlib import Path

import lit.formats

config.name = "tilefold"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".tfir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py"]

python = sys.executable
src = Path(__file__).resolve().parents[2] / "src"
config.environment["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p
)
config.substitutions.append(("%dist-opt", f"{python} -m tilefold.distributed"))
config.substitutions.append(("%opt", f"{python} -m tilefold.passes"))
config.substitutions.append((r"\bFileCheck\b", f"{python} -m filecheck"))
