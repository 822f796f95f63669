"""The pass manager: runs passes in order, verifies after each, dumps IR, times and counts."""

from __future__ import annotations

import io
import logging
import re

import numpy as np
import pytest

from tilefold.errors import PassError, ShapeError, VerificationError
from tilefold.ir import Builder, Function, Module, TensorType, parse_module, print_module
from tilefold.ir import functional as F
from tilefold.passes import CSE, DCE, Pass, PassManager, Statistic, run_pipeline

TEXT = """\
func @main(%x: f32[4]) -> (f32[4]) {
  %one = constant() {value = dense<f32[] [1.0]>} : f32[]
  %0 = mul(%x, %one) : f32[4]
  %1 = exp(%0) : f32[4]
  %2 = exp(%x) : f32[4]
  %3 = add(%1, %2) : f32[4]
  return(%3)
}
"""


def module() -> Module:
    return parse_module(TEXT, "input.tfir")


class BreaksTypes(Pass):
    """A deliberately broken pass: declares a wrong result type."""

    name = "breaks-types"
    summary = "Corrupts the first result type (test only)"

    def run_on_function(self, fn: Function) -> None:
        op = fn.ops[1]
        op.results[0].type = TensorType.of("f32", [5])


class Raises(Pass):
    name = "raises"
    summary = "Raises a ShapeError (test only)"
    statistics = (Statistic("num-tries", "tries"),)

    def run_on_function(self, fn: Function) -> None:
        self.count("num-tries")
        raise ShapeError("cannot do this shape")


def test_runs_passes_in_order() -> None:
    m = PassManager("canonicalize,cse,dce").run(module())
    assert [op.name for op in m["main"].ops] == ["exp", "add", "return"]


def test_accepts_instances_and_texts() -> None:
    pm = PassManager([CSE(), "canonicalize", DCE()]).add("dce")
    assert [p.name for p in pm.passes] == ["cse", "canonicalize", "dce", "dce"]


def test_run_pipeline_returns_the_module() -> None:
    m = module()
    assert run_pipeline(m, "default") is m


def test_verify_each_names_the_pass_that_broke_the_ir() -> None:
    with pytest.raises(PassError) as info:
        PassManager([BreaksTypes()]).run(module())
    assert "pass 'breaks-types' left invalid IR" in info.value.message
    assert "does not match the inferred f32[4]" in info.value.message
    assert info.value.loc.line == 3  # the op the pass broke, where it was parsed
    assert "input.tfir:3:8: error:" in str(info.value)


def test_verify_each_off_still_verifies_the_pipeline_output() -> None:
    """Off (the JIT), the verifier runs once at the end and points at --verify-each."""
    with pytest.raises(PassError) as info:
        PassManager([BreaksTypes()], verify_each=False).run(module())
    assert "pipeline 'breaks-types'" in info.value.message
    assert "--verify-each" in info.value.message


def test_an_invalid_input_is_not_blamed_on_a_pass() -> None:
    m = module()
    m["main"].ops[1].results[0].type = TensorType.of("f32", [5])
    with pytest.raises(VerificationError):
        PassManager("cse").run(m)


def test_errors_inside_a_pass_name_it() -> None:
    with pytest.raises(PassError, match="pass 'raises' failed: cannot do this shape"):
        PassManager([Raises()]).run(module())


def dumps(**options) -> str:
    stream = io.StringIO()
    PassManager("canonicalize,cse,dce", stream=stream, **options).run(module())
    return stream.getvalue()


def test_print_ir_after_all() -> None:
    text = dumps(print_ir_after_all=True)
    headers = re.findall(r"^// -----// IR Dump (.*) //----- //$", text, re.MULTILINE)
    assert headers == ["After canonicalize", "After cse", "After dce"]
    after_cse = text.split("// -----// IR Dump After cse //----- //\n")[1].split("\n\n")[0]
    assert after_cse == print_module(PassManager("canonicalize,cse").run(module())).rstrip()


def test_print_ir_before_and_after_named_passes() -> None:
    text = dumps(print_ir_before={"cse"}, print_ir_after={"dce"})
    headers = re.findall(r"IR Dump (.*?) //", text)
    assert headers == ["Before cse", "After dce"]
    assert dumps(print_ir_before_all=True).count("IR Dump Before") == 3


def test_print_ir_names_must_be_passes() -> None:
    with pytest.raises(PassError, match="print_ir_after: unknown pass 'cs' \\(did you mean 'cse'"):
        PassManager("cse", print_ir_after={"cs"})


def test_dumps_go_to_stderr_by_default(capsys) -> None:
    PassManager("dce", print_ir_after_all=True).run(module())
    assert "IR Dump After dce" in capsys.readouterr().err


def test_timing_report() -> None:
    pm = PassManager("canonicalize,cse")
    pm.run(module())
    pm.run(module())  # times add up over runs
    report = pm.timing_report()
    assert "... Execution time report ..." in report
    rows = dict(
        (name, float(secs))
        for secs, name in re.findall(r"^\s+([0-9.]+) \(\s*[0-9.]+%\)  (\S+)$", report, re.M)
    )
    assert list(rows) == ["verifier", "canonicalize", "cse", "Total"]
    assert rows["Total"] == pytest.approx(sum(v for k, v in rows.items() if k != "Total"), abs=2e-4)
    assert "(100.0%)  Total" in report


def test_statistics_report_adds_up_over_runs() -> None:
    pm = PassManager("canonicalize,cse")
    pm.run(module())
    pm.run(module())
    canon, cse = pm.passes
    assert canon.stats == {"num-rewrites": 2, "num-erased": 2}
    assert cse.stats == {"num-cse": 2}
    report = pm.statistics_report()
    assert "'cse'\n  (num-cse) 2 - ops replaced by an earlier identical op" in report


def test_logs_each_pass(caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="tilefold.passes"):
        PassManager("canonicalize{max-iterations=2},dce").run(module())
    messages = [r.getMessage() for r in caplog.records]
    assert "running canonicalize{max-iterations=2}" in messages
    assert "canonicalize: x * 1 -> x on %0" in messages


def test_builder_modules_run_too() -> None:
    b = Builder("main")
    x = b.arg("x", "f32", ("batch", 4))
    m = b.build(F.relu(F.relu(x * np.float32(1))))
    run_pipeline(m, "default")
    assert [op.name for op in m["main"].ops] == ["relu", "return"]
