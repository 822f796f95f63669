"""The GEMV's plan parameters (prefetch distance, axpy panel): every value the tuner may try
gives the right answer, a measured record is what plans use, a bad one is ignored, and
`tilefold tune --gemm`'s search records both forms."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from tests.gemm.reference import check_matmul
from tilefold.cli.main import main
from tilefold.codegen.gemm import tuned
from tilefold.codegen.llvm.gemm.gemv import GemvMode
from tilefold.codegen.llvm.gemm.gemv_config import (
    GemvConfig,
    derive_gemv_config,
    model_gemv_config,
    record_name,
)
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import GemvPlan, make_plan
from tilefold.codegen.llvm.gemm.tuning import GEMV_STAGES, tune_gemv
from tilefold.runtime import num_threads
from tilefold.target import host_target

# every value the search tries, plus panels that are no multiple of the vector width
CONFIGS = [GemvConfig(ahead=a, panel=p) for a in GEMV_STAGES[0][1]
           for p in (*GEMV_STAGES[1][1], 1, 13, 24)]


@pytest.mark.parametrize("form", ["x@W (axpy)", "W@x (dot)"])
def test_every_tuning_candidate_gives_the_right_answer(form):
    rng = np.random.default_rng(4)
    module = gemm_module()
    for outs, k in ((1, 7), (37, 53), (131, 9), (256, 300)):
        if form.startswith("x"):
            a, b = rng.standard_normal((1, k), dtype=np.float32), \
                rng.standard_normal((k, outs), dtype=np.float32)
        else:
            a, b = rng.standard_normal((outs, k), dtype=np.float32), \
                rng.standard_normal((k, 1), dtype=np.float32)
        mode = GemvMode.AXPY if form.startswith("x") else GemvMode.DOT
        for config in CONFIGS:
            for beta, threads in ((0, 1), (1, 2)):
                c0 = rng.standard_normal((a.shape[0], b.shape[1]), dtype=np.float32)
                c = c0.copy() if beta else np.full_like(c0, np.nan)
                n_out, ldw = (outs, outs) if mode == GemvMode.AXPY else (outs, k)
                plan = GemvPlan(module, n_out, k, ldw, 1, 1, beta, threads, mode,
                                mode == GemvMode.DOT, config)
                plan(a, b, c)
                if beta:
                    ref = a.astype(np.float64) @ b + c0
                    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k + 1),
                                               err_msg=f"{config} {outs}x{k}")
                else:
                    check_matmul(c, a, b)


def test_a_recorded_gemv_config_is_what_plans_use(store):
    target = host_target()
    odd = GemvConfig(ahead=32, panel=24)
    assert odd != model_gemv_config(target, GemvMode.AXPY)
    tuned.save_record(target, record_name(GemvMode.AXPY),
                      {"ahead": odd.ahead, "panel": odd.panel, "model": [64, 0], "speedup": 1.1,
                       "threads": 1})
    assert derive_gemv_config(target, GemvMode.AXPY, 1) == odd
    assert derive_gemv_config(target, GemvMode.DOT, 1) == model_gemv_config(target, GemvMode.DOT)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 333), dtype=np.float32)
    w = rng.standard_normal((333, 101), dtype=np.float32)
    c = np.empty((1, 101), np.float32)
    plan = make_plan(gemm_module(target), x, w, c, 0, 1)
    assert isinstance(plan, GemvPlan) and plan.config == odd
    plan(x, w, c)
    check_matmul(c, x, w)


@pytest.mark.parametrize("bad", [{"ahead": -1, "panel": 0}, {"ahead": "far", "panel": 0},
                                 {"ahead": 64}, {"ahead": 64, "panel": 1 << 30}])
def test_a_gemv_record_that_does_not_fit_is_ignored_with_a_warning(store, bad, caplog):
    target = host_target()
    tuned.save_record(target, record_name(GemvMode.DOT), {**bad, "threads": 1})
    with caplog.at_level(logging.WARNING, logger="tilefold.tuning"):
        got = derive_gemv_config(target, GemvMode.DOT, 1)
    assert got == model_gemv_config(target, GemvMode.DOT)
    assert "gemv-dot" in caplog.text and "tune --gemm" in caplog.text


def test_tuning_records_both_forms_and_info_says_so(store, capsys):
    target, threads = host_target(), num_threads()  # what `info` describes
    outcomes = tune_gemv(target, threads=threads, budget_s=0.4, shapes=((300, 200), (77, 1000)))
    assert sorted(o.kernel for o in outcomes) == ["gemv-axpy", "gemv-dot"]
    data = json.loads(store.read_text())
    for o in outcomes:
        entry = data["entries"][tuned.record_key(target, o.kernel, threads)]
        assert (entry["ahead"], entry["panel"]) == (o.best.ahead, o.best.panel)
        assert o.speedup >= 1.0 and o.candidates > 1
        mode = GemvMode.AXPY if o.kernel == "gemv-axpy" else GemvMode.DOT
        assert derive_gemv_config(target, mode, threads) == o.best
    assert tune_gemv(target, threads=threads, budget_s=0.4, missing_only=True) == []
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "gemv f32 (dot): prefetch" in out and "measured, " in out
