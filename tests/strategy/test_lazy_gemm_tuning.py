"""Under TILEFOLD_TUNE the first compile with a GEMM tunes the GEMM's blocking on the machine
(once: later compiles and processes read the record), and results stay right."""

from __future__ import annotations

import numpy as np
import pytest

import tilefold as tf
from tilefold.codegen.gemm import tuned
from tilefold.codegen.gemm.blocking import derive_blocking
from tilefold.codegen.llvm.gemm import tuning
from tilefold.codegen.llvm.gemm.tuning import tuned_kernels
from tilefold.ir import Builder
from tilefold.ir import functional as F
from tilefold.runtime import num_threads
from tilefold.strategy import autotune
from tilefold.target import host_target


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A private tuning folder, the process's "already checked" memory cleared, and small
    products to tune on (the search and the records are the real ones)."""
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_blocking_checked", set())
    monkeypatch.setattr(tuning, "shapes_for", lambda kernel: ((64, 48, 80), (33, 17, 130)))
    tuned.forget()
    yield
    tuned.forget()


def _mlp(rng):
    b = Builder("main")
    x = b.arg("x", "f32", (37, 64))
    w = b.constant(rng.standard_normal((64, 48)).astype(np.float32))
    return b.build(F.relu(F.matmul(x, w)))


def test_first_tuned_compile_records_every_kernels_blocking(fresh, monkeypatch):
    rng = np.random.default_rng(5)
    module = _mlp(rng)
    target, threads = host_target(), num_threads()  # what a compile plans with
    assert all(tuned.tuned_record(target, k.name, k.mr, k.nr, threads) is None
               for k in tuned_kernels(target))
    monkeypatch.setenv("TILEFOLD_TUNE", str(2 * autotune.LAZY_MIN_S))
    x = rng.standard_normal((37, 64)).astype(np.float32)
    (got,) = tf.compile(module)(x)  # kernels are chosen (and tuned) at the first call
    (want,) = tf.interpret(module, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for kern in tuned_kernels(target):
        record = tuned.tuned_record(target, kern.name, kern.mr, kern.nr, threads)
        assert record is not None, kern.name
        assert derive_blocking(target, kern, threads).mc == record["mc"]
    # once per process, and a machine already tuned is not tuned again
    assert autotune.tune_gemm_blocking_once(target, threads, 100.0) == []
    monkeypatch.setattr(autotune, "_blocking_checked", set())
    assert autotune.tune_gemm_blocking_once(target, threads, 100.0) == []


def test_a_small_budget_leaves_the_blocking_to_tune_gemm(fresh, monkeypatch):
    monkeypatch.setenv("TILEFOLD_TUNE", "0.2")
    rng = np.random.default_rng(6)
    tf.compile(_mlp(rng))(rng.standard_normal((37, 64)).astype(np.float32))
    assert autotune._blocking_checked == set()
    target, threads = host_target(), num_threads()  # what a compile plans with
    assert all(tuned.tuned_record(target, k.name, k.mr, k.nr, threads) is None
               for k in tuned_kernels(target))
