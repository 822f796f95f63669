"""GEMM blocking measured on the machine: recorded per fingerprint, read back by the plans,
ignored when it does not fit, and never able to change a result."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import tilefold.linalg as tl
from tests.gemm.reference import check_matmul
from tilefold.cli.main import main
from tilefold.codegen.gemm import tuned
from tilefold.codegen.gemm.blocking import Blocking, derive_blocking, model_blocking
from tilefold.codegen.llvm.gemm.module import gemm_module
from tilefold.codegen.llvm.gemm.plan import make_plan
from tilefold.codegen.llvm.gemm.registry import select_microkernel
from tilefold.codegen.llvm.gemm.tuning import tune_gemm, tuned_kernels
from tilefold.runtime import num_threads
from tilefold.target import host_target
from tilefold.version import __version__


def _record(mc, kc, nc, **extra):
    return {"mc": mc, "kc": kc, "nc": nc, "itemsize": 4, "model": [1, 1, 1], "speedup": 1.0,
            "threads": 1, **extra}


def test_a_recorded_blocking_is_what_plans_use_and_results_stay_right(store):
    target, kern = host_target(), select_microkernel(host_target())
    odd = Blocking(mc=kern.mr * 3, kc=48, nc=kern.nr * 2)  # far from the model: many blocks
    assert odd != model_blocking(target, kern)
    tuned.save_record(target, kern.name, _record(odd.mc, odd.kc, odd.nc))
    assert derive_blocking(target, kern, 1) == odd
    rng = np.random.default_rng(3)
    a = rng.standard_normal((97, 301), dtype=np.float32).T.copy().T  # A packed (general kernel)
    b = rng.standard_normal((301, 131), dtype=np.float32)
    c = np.empty((97, 131), np.float32)
    plan = make_plan(gemm_module(target, kern), a, b, c, 0, 1)
    assert plan.blocking.kc <= odd.kc and plan.blocking.nc <= odd.nc
    plan(a, b, c)
    check_matmul(c, a, b)
    check_matmul(tl.matmul(a, b, threads=2), a, b)


def test_records_are_per_thread_count():
    """The best blocking at one thread is not the best at two (znver3: 192/384/8192 against
    378/512/4096): each thread count reads its own record, a count with none the model, and
    a two-thread plan runs with the two-thread record and stays right."""
    target, kern = host_target(), select_microkernel(host_target())
    one = Blocking(mc=kern.mr * 3, kc=48, nc=kern.nr * 2)
    two = Blocking(mc=kern.mr * 5, kc=64, nc=kern.nr * 3)
    tuned.save_record(target, kern.name, _record(one.mc, one.kc, one.nc))
    tuned.save_record(target, kern.name, _record(two.mc, two.kc, two.nc, threads=2))
    assert derive_blocking(target, kern, 1) == one
    assert derive_blocking(target, kern, 2) == two
    assert derive_blocking(target, kern, 3) == model_blocking(target, kern)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((197, 301), dtype=np.float32).T.copy().T
    b = rng.standard_normal((301, 131), dtype=np.float32)
    c = np.empty((197, 131), np.float32)
    plan = make_plan(gemm_module(target, kern), a, b, c, 0, 2)
    assert plan.blocking.kc <= two.kc and plan.blocking.nc <= two.nc
    assert plan.blocking.mc <= two.mc and plan.blocking.mc > one.mc
    plan(a, b, c)
    check_matmul(c, a, b)


@pytest.mark.parametrize("bad", [
    {"mc": 7, "kc": 64, "nc": 64},                 # MC not a multiple of MR (4, 6, 8, 12)
    {"mc": 0, "kc": 64, "nc": 64},
    {"mc": "many", "kc": 64, "nc": 64},
    {"mc": 48, "kc": 64, "nc": 64, "tilefold": "0.0.1"},   # another version wrote it
])
def test_a_record_that_does_not_fit_is_ignored_with_a_warning(store, bad, caplog):
    target, kern = host_target(), select_microkernel(host_target())
    tuned.save_record(target, kern.name, _record(**bad))
    if "tilefold" in bad:  # save_record stamps the running version: write the stale one
        data = json.loads(store.read_text())
        for entry in data["entries"].values():
            entry["tilefold"] = bad["tilefold"]
        store.write_text(json.dumps(data))
        tuned.forget()
    with caplog.at_level(logging.WARNING, logger="tilefold.tuning"):
        assert derive_blocking(target, kern, 1) == model_blocking(target, kern)
    assert "tune --gemm" in caplog.text


@pytest.mark.parametrize("text", ["{not json", '{"schema": 99, "entries": {}}', "[]", ""])
def test_a_damaged_file_means_the_model(store, text):
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(text)
    target, kern = host_target(), select_microkernel(host_target())
    assert derive_blocking(target, kern, 1) == model_blocking(target, kern)


def test_tuning_records_every_kernel_and_info_says_so(store, capsys):
    target, threads = host_target(), num_threads()  # what `info` describes
    outcomes = tune_gemm(target, threads=threads, budget_s=0.5,
                         shapes=((64, 48, 80), (33, 17, 130)))
    assert [o.kernel for o in outcomes] == [k.name for k in tuned_kernels(target)]
    data = json.loads(store.read_text())
    assert data["schema"] == tuned.SCHEMA
    for o in outcomes:
        kern = next(k for k in tuned_kernels(target) if k.name == o.kernel)
        assert o.best.mc % kern.mr == 0 and o.best.nc % kern.nr == 0 and o.speedup >= 1.0
        entry = data["entries"][tuned.record_key(target, o.kernel, threads)]
        assert (entry["mc"], entry["kc"], entry["nc"]) == (o.best.mc, o.best.kc, o.best.nc)
        assert entry["tilefold"] == __version__ and entry["threads"] == threads
        assert derive_blocking(target, kern, threads) == o.best
    assert main(["info"]) == 0
    assert "measured blocking" in capsys.readouterr().out


def test_tune_gemm_refuses_a_file_with_it(store, capsys):
    assert main(["tune", "--gemm", "--model", "gpt2"]) != 0
    assert "--gemm tunes alone: give no IR file" in capsys.readouterr().err


def test_a_kernel_for_narrow_products_is_tuned_on_products_it_takes() -> None:
    from tilefold.codegen.llvm.gemm.registry import MICROKERNELS
    from tilefold.codegen.llvm.gemm.tuning import shapes_for

    for kernel in MICROKERNELS:
        widest = kernel.nr if kernel.shape_class == "narrow" else kernel.max_n
        if widest is not None:
            assert all(n <= widest for _, n, _ in shapes_for(kernel)), kernel.name
