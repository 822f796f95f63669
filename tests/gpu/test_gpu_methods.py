"""The GPU in the one kernel framework: Triton kernels and the torch library are registered
methods proposing for GPU targets only, and `strategy.select` chooses among them with the GPU
platform's reference and timer (a deterministic fake here): the fastest measured candidate
wins and is stored under the GPU fingerprint, a warm process times nothing, cuBLAS
(torch.matmul) races beside the template, wrong or failing candidates never win (strict
mode raises on a wrong one), and untuned the cost model's first config runs."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

import tilefold.target.gpu as gpu_target_module  # noqa: E402
from tests.gpu.placement import f64, host, tensor  # noqa: E402
from tests.tolerances import assert_close  # noqa: E402
from tilefold.codegen.triton.gemm_config import propose_configs  # noqa: E402
from tilefold.compiler import optimized  # noqa: E402
from tilefold.errors import WrongAnswerError  # noqa: E402
from tilefold.gpu import GPUGraph  # noqa: E402
from tilefold.ir import Builder  # noqa: E402
from tilefold.ir import functional as F  # noqa: E402
from tilefold.strategy import Candidate, Kernel, Problem, context, select  # noqa: E402
from tilefold.strategy.method import METHODS, candidate_key  # noqa: E402
from tilefold.strategy.tuning_db import TuningDB  # noqa: E402
from tilefold.target import gpu_target, hardware_fingerprint  # noqa: E402
from tilefold.target.gpu import gpu_fingerprint  # noqa: E402

RNG = np.random.default_rng(1607)
H200 = gpu_target("h200")
M, K, N = 33, 40, 48
EXTERN = candidate_key("extern.torch.gpu", {})
GPU_METHODS = {"triton.memory", "triton.gemm", "triton.attention", "extern.torch.gpu",
               "extern.host"}


class FakeTimer:
    """Returns the given milliseconds in turn (the extern is timed first, then the configs
    in the cost model's order); counts its calls and runs nothing."""

    def __init__(self, times=()):
        self.times, self.calls = list(times), 0

    def __call__(self, fn) -> float:
        self.calls += 1
        return self.times.pop(0) if self.times else 10.0


def _linear():
    """x @ w + b -> relu, with a constant weight and bias."""
    b = Builder("main")
    x = b.arg("x", "f32", (M, K))
    w = RNG.standard_normal((K, N)).astype(np.float32)
    bias = RNG.standard_normal(N).astype(np.float32)
    module = b.build(F.relu(F.matmul(x, b.constant(w)) + b.constant(bias)))
    return module, w, bias


def _check(graph, w, bias):
    x = RNG.standard_normal((M, K)).astype(np.float32)
    (got,) = graph(tensor(x))
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + bias, 0)
    assert_close(host(got), want, dtype="f32", reduced=K)


def _compiled(module, tmp_path, timer, budget=30.0):
    """`tf.compile(module, target=H200)` with this timer, budget and database."""
    return GPUGraph(optimized(module, "main")[0], "main", H200, strict=True, timer=timer,
                    budget=budget, db=TuningDB(tmp_path / "db.json"))


def _gemm_line(graph) -> str:
    return next(line for line in graph.report() if "matmul" in line or "GEMM" in line)


def _key(config) -> str:
    return candidate_key("triton.gemm", asdict(config))


def test_gpu_methods_propose_for_gpu_targets_only():
    module, _, _ = _linear()
    fused = next(op for op in optimized(module, "main")[0]["main"].ops if op.name == "fused")
    problem = Problem.of(fused, [(M, K), (K, N), (N,)])
    on_cpu, _ = select.propose_all(problem, context())
    on_gpu, refused = select.propose_all(problem, context(H200))
    assert not {c.method for c in on_cpu} & GPU_METHODS
    assert {c.method for c in on_gpu} == {"triton.gemm", "extern.torch.gpu"}
    assert {r.method for r in refused} <= GPU_METHODS  # the CPU's methods are not asked
    assert all(METHODS[m].platforms == ("gpu",) for m in GPU_METHODS)


def test_the_fastest_config_wins_and_a_warm_process_times_nothing(tmp_path):
    module, w, bias = _linear()
    configs = propose_configs(H200, M, N, K, "f32")
    assert len(configs) >= 2
    # extern 5 ms, then configs: the second one is fastest
    timer = FakeTimer([5.0, 3.0, 1.0, *[4.0] * (len(configs) - 2)])
    graph = _compiled(module, tmp_path, timer)
    _check(graph, w, bias)
    assert timer.calls == len(configs) + 1
    winner = _key(configs[1])
    assert _gemm_line(graph).endswith(
        f"Triton GEMM template ({winner}: fastest of {len(configs) + 1} measured (tuned now))")
    (entry,) = TuningDB(tmp_path / "db.json").entries().values()
    assert entry["winner"] == winner
    assert entry["fingerprint"] == gpu_fingerprint(H200) != hardware_fingerprint()
    assert entry["timings"][EXTERN] == 5e-3  # seconds, as the CPU's
    (gemm,) = [d for d in graph.decisions() if d.winner.method == "triton.gemm"]
    assert gemm.winner.key == winner and gemm.measured[EXTERN] == 5e-3

    warm_timer, tuned = FakeTimer(), select.TUNED
    graph = _compiled(module, tmp_path, warm_timer)
    _check(graph, w, bias)
    assert (warm_timer.calls, select.TUNED) == (0, tuned)
    assert "tuning database" in _gemm_line(graph)


def test_cublas_wins_when_it_is_fastest(tmp_path):
    module, w, bias = _linear()
    timer = FakeTimer([0.5])  # the extern is timed first; every config then takes 10 ms
    graph = _compiled(module, tmp_path, timer)
    _check(graph, w, bias)
    assert f"torch.matmul + Triton epilogue ({EXTERN}" in _gemm_line(graph)


def test_untuned_runs_the_first_proposal_and_measures_nothing(tmp_path):
    module, w, bias = _linear()
    timer = FakeTimer()
    graph = _compiled(module, tmp_path, timer, budget=None)
    assert _gemm_line(graph).endswith("Triton GEMM template")  # before any call
    _check(graph, w, bias)
    first = _key(propose_configs(H200, M, N, K, "f32")[0])
    assert f"({first}: lowest estimated cost" in _gemm_line(graph)
    assert timer.calls == 0
    assert not (tmp_path / "db.json").exists()


def _matmul_problem(a, b):
    bld = Builder("main")
    x = bld.arg("a", "bf16" if a.dtype == torch.bfloat16 else "f32", tuple(a.shape))
    y = bld.arg("b", "bf16" if b.dtype == torch.bfloat16 else "f32", tuple(b.shape))
    module = bld.build(F.matmul(x, y))
    op = next(o for o in module["main"].ops if o.name == "matmul")
    return Problem.of(op, [tuple(a.shape), tuple(b.shape)])


def _candidate(name, run, family="building-blocks", rank=0):
    """A candidate whose kernel is `run(a, b) -> [c]`."""
    return Candidate(name, family, {}, float(rank), lambda: Kernel(run))


def _matmul_candidates():
    def broken():
        raise RuntimeError("no such tile")

    return [_candidate("wrong", lambda a, b: [a[:, :-1] @ b[:-1]]),  # a K tail dropped
            Candidate("broken", "building-blocks", {}, 1.0, broken),
            _candidate("right", lambda a, b: [(a.double() @ b.double()).float()], rank=2),
            _candidate("extern", lambda a, b: [a @ b], "extern", rank=3)]


def _choose(tmp_path, timer, tensors, candidates, budget=30.0):
    ctx = replace(context(H200, timer=timer), arrays=tuple(tensors))
    return select.choose(_matmul_problem(*tensors), ctx, candidates, [],
                         TuningDB(tmp_path / "db.json"), budget)


def _pair(m, k, n, dtype=torch.float32):
    return (tensor(RNG.standard_normal((m, k)).astype(np.float32)).to(dtype),
            tensor(RNG.standard_normal((k, n)).astype(np.float32)).to(dtype))


def test_wrong_and_failing_candidates_score_inf(tmp_path, allow_fallback):
    a, b = _pair(9, 7, 5)
    timer = FakeTimer([2.0, 1.0])  # extern 2 ms, then "right" 1 ms; "wrong" is never timed
    decision = _choose(tmp_path, timer, (a, b), _matmul_candidates())
    assert decision.winner.key == "right{}"
    assert decision.failures["wrong{}"].startswith("wrong answer")
    assert "no such tile" in decision.failures["broken{}"]
    assert "wrong{}" not in decision.measured and timer.calls == 2
    (entry,) = TuningDB(tmp_path / "db.json").entries().values()
    assert entry["timings"]["wrong{}"] == entry["timings"]["broken{}"] == "inf"
    (got,) = decision.kernel.run(a, b)
    assert_close(host(got), f64(a) @ f64(b), dtype="f32", reduced=7)


def test_strict_mode_raises_on_a_wrong_candidate(tmp_path):
    with pytest.raises(WrongAnswerError, match=r"wrong.*strict mode"):
        _choose(tmp_path, FakeTimer(), _pair(9, 7, 5), _matmul_candidates())


def test_a_bf16_candidate_missing_one_k_block_of_many_fails_against_f32(tmp_path):
    # K = 2048 in bf16, one 64-wide block of it dropped: 3% of the terms, far outside the
    # bf16 tolerance for K terms against the extern run on f32 copies
    k = 2048
    a, b = _pair(32, k, 24, torch.bfloat16)
    cands = [_candidate("dropped", lambda a, b: [(a[:, 64:].float() @ b[64:].float())
                                                 .bfloat16()]),
             _candidate("right", lambda a, b: [(a.double() @ b.double()).bfloat16()], rank=1),
             _candidate("extern", lambda a, b: [a @ b], "extern", rank=2)]
    with pytest.raises(WrongAnswerError, match="dropped"):
        _choose(tmp_path, FakeTimer(), (a, b), cands)
    decision = _choose(tmp_path, FakeTimer([3.0, 2.0]), (a, b), cands[1:])
    assert decision.winner.key == "right{}" and not decision.failures


def test_the_extern_is_timed_even_when_the_budget_is_spent(tmp_path, allow_fallback):
    timer = FakeTimer([3.0])
    decision = _choose(tmp_path, timer, _pair(4, 6, 3), _matmul_candidates(), budget=0.0)
    assert (decision.winner.key, timer.calls) == ("extern{}", 1)


def test_gpu_fingerprint_names_the_device_and_the_target(monkeypatch):
    bare = gpu_fingerprint(H200)
    assert bare == gpu_fingerprint(H200) != gpu_fingerprint(gpu_target("h100"))
    monkeypatch.setattr(gpu_target_module, "_device_parts",
                        lambda: ["NVIDIA H200", "cc 9.0", "132 SMs", "driver 12080", "cuda 12.8"])
    assert gpu_fingerprint(H200) != bare
