"""benchmarks/gpu.py's driver on the CPU: each case in its own process with its own timeout, so
a crash or a hang ends that case only, the tables rewritten after each; one real case of
`--smoke` (softmax through tilefold.compile under the interpreter) checked against f32."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
pytest.importorskip("torch")

# on a device, benchmarks/gpu.py is what runs these tests
pytestmark = pytest.mark.interpreter_only("benchmarks/gpu.py --smoke, the CPU's interpreted run")

ROOT = Path(__file__).resolve().parents[2]


def _driver():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_crash_and_a_hang_end_their_own_case_only(tmp_path):
    bench = _driver()
    assert bench.missing_imports() == []
    args = bench._args([str(tmp_path), "--smoke", "--only", "softmax"])
    (softmax,) = bench.cases(args)
    assert softmax.env["TILEFOLD_STRICT"] == "1" and "--case" in softmax.argv
    py = sys.executable
    crash = bench.Case("crash", [py, "-c", "import os; os.abort()"], 30)
    hang = bench.Case("hang", [py, "-c", "import time; time.sleep(60)"], 2)
    tables = bench.Tables(tmp_path, "cpu")
    assert bench.run_cases([crash, hang, softmax], tables, budget=120) == 2
    rows = {r["case"]: r for r in json.loads((tmp_path / "gpu.json").read_text())["rows"]}
    assert "killed by SIGABRT" in rows["crash"]["note"]
    assert "timed out after 2 s" in rows["hang"]["note"] and rows["hang"]["seconds"] < 30
    (real,) = (r for name, r in rows.items() if name.startswith("softmax bf16"))
    assert not real.get("failed") and set(real["ms"]) == {"tilefold", "eager"}
    assert real["errors"]["tilefold"] <= 2 ** -7  # bf16 results: a few of their ulps at most
    table = (tmp_path / "gpu.md").read_text()
    assert table.count("\n| ") == 4 and "FAILED (killed by SIGABRT)" in table
    late = bench.Case("late", [py, "-c", "pass"], 30)
    assert bench.run_cases([late], tables, budget=5) == 1  # no time left: not started
    assert "not run" in tables.rows[-1]["note"]
