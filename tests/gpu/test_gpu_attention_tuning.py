"""Attention configs: what `propose_attention_configs` offers (within shared memory, sized to the
problem, its first choice compiled for sm_90 as wgmma without spills) and the GPU tuner racing
them against torch's SDPA in `tilefold.gpu`, checked against float64 NumPy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton", reason="Triton is an optional extra: pip install 'tilefold[triton]'")
torch = pytest.importorskip("torch")

from tests.gpu.placement import host, tensor  # noqa: E402
from tests.tolerances import assert_close  # noqa: E402
from tilefold.codegen.triton.attention import AttentionSpec, head_tile  # noqa: E402
from tilefold.codegen.triton.attention_config import propose_attention_configs  # noqa: E402
from tilefold.codegen.triton.ptx import compile_attention_ptx  # noqa: E402
from tilefold.compiler import optimized  # noqa: E402
from tilefold.errors import UnsupportedError  # noqa: E402
from tilefold.gpu import GPUGraph  # noqa: E402
from tilefold.ir import Builder  # noqa: E402
from tilefold.strategy.method import candidate_key  # noqa: E402
from tilefold.strategy.tuning_db import TuningDB  # noqa: E402
from tilefold.target import gpu_target  # noqa: E402

RNG = np.random.default_rng(1608)
H200 = gpu_target("h200")
Q, KV = (1, 4, 9, 16), (1, 2, 9, 16)


@pytest.mark.parametrize("heads, seq, d", [(32, 4096, 128), (32, 4096, 64), (2, 9, 16),
                                           (8, 300, 80)])
def test_proposals_fit_shared_memory_and_the_problem(heads, seq, d):
    configs = propose_attention_configs(H200, heads, seq, seq, d, "bf16")
    assert configs
    for c in configs:
        assert c.shared_bytes(d, "bf16") <= H200.shared_memory_per_block
        assert c.block_m <= max(16, 1 << (seq - 1).bit_length())
    assert len(set(configs)) == len(configs)


@pytest.mark.parametrize("d", [128, 64])
def test_the_first_proposal_is_wgmma_on_sm_90_without_spills(d):
    first = propose_attention_configs(H200, 32 * 4, 4096, 4096, d, "bf16")[0]
    assert first.block_m >= 64  # a long sequence takes whole warpgroups of query rows
    report = compile_attention_ptx(AttentionSpec("bf16", causal=True), H200, head_d=head_tile(d),
                                   **first.launch())
    assert "wgmma" in report["ptx"]
    assert report["shared"] <= H200.shared_memory_per_block and report["spills"] == 0


def test_refusals_name_the_problem():
    with pytest.raises(UnsupportedError, match="f32/f16/bf16, not fp8e4m3"):
        propose_attention_configs(H200, 1, 16, 16, 16, "fp8e4m3")
    with pytest.raises(UnsupportedError, match="Sq, Sk, D = 1, 0, 16, 16"):
        propose_attention_configs(H200, 1, 0, 16, 16, "f32")


class FakeTimer:
    def __init__(self, times):
        self.times, self.calls = list(times), 0

    def __call__(self, fn) -> float:
        self.calls += 1
        return self.times.pop(0) if self.times else 10.0


def _graph(tmp_path, timer):
    b = Builder("main")
    q, k, v = b.arg("q", "f32", Q), b.arg("k", "f32", KV), b.arg("v", "f32", KV)
    module = b.build(b.op("scaled_dot_product_attention", q, k, v, is_causal=True,
                          enable_gqa=True))
    return GPUGraph(optimized(module, "main")[0], "main", H200, strict=True, timer=timer,
                    budget=30.0, db=TuningDB(tmp_path / "db.json"))


def _run(graph):
    qv, kv, vv = (RNG.standard_normal(s).astype(np.float32) for s in (Q, KV, KV))
    (got,) = graph(*map(tensor, (qv, kv, vv)))
    kr, vr = (np.repeat(a.astype(np.float64), 2, axis=1) for a in (kv, vv))
    scores = qv.astype(np.float64) @ kr.transpose(0, 1, 3, 2) / 4.0
    scores = np.where(np.tril(np.ones((9, 9), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    assert_close(host(got), (p / p.sum(-1, keepdims=True)) @ vr, dtype="f32", reduced=16)
    return graph.report()[-1]


def test_the_tuner_picks_an_attention_config_or_sdpa(tmp_path):
    configs = propose_attention_configs(H200, 4, 9, 9, 16, "f32")
    timer = FakeTimer([5.0, 1.0])  # SDPA 5 ms, the first config 1 ms
    line = _run(_graph(tmp_path / "a", timer))
    first = candidate_key("triton.attention", configs[0].launch())
    assert line.endswith(f"Triton attention template ({first}: fastest of {len(configs) + 1} "
                         "measured (tuned now))"), line
    assert timer.calls == len(configs) + 1
    line = _run(_graph(tmp_path / "b", FakeTimer([0.1])))  # SDPA fastest
    assert "torch SDPA (extern.torch.gpu{}: fastest of" in line, line
