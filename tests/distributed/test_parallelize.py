"""parallelize: an nn.Module's forward exported, planned by each registered strategy (or by
placements given per name), partitioned, and run on the simulated ranks and by spawned gloo
processes: every rank's output matches the one-process model (float64 torch).

By default one 2-rank gloo job runs the GPT-2-style and the LLaMA-style block under Megatron,
and 8 simulated ranks run both under Megatron (GPT-2 also with sequence parallelism);
`TILEFOLD_DIST_FULL=1` adds the full matrix: both blocks under dp, megatron, megatron-sp and
ilp on 2 and on 4 gloo ranks (one job per world size; about 2 minutes on a 2-core host) and
on 8 simulated ranks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.gloo_job import run_gloo_job
from tests.distributed.test_torchrun import warm_kernels
from tests.distributed.torch_blocks import model_and_input
from tilefold.distributed import STRATEGIES, parallelize, run_ranks
from tilefold.errors import TilefoldError

torch = pytest.importorskip("torch")

FULL = os.environ.get("TILEFOLD_DIST_FULL") == "1"
MEGATRON = {"fc1.weight": "[S(0)]", "fc1.bias": "[S(0)]", "fc2.weight": "[S(1)]"}
MESHES = {  # strategy -> its mesh of 2 and of 4 devices
    "dp": ({"dp": 2}, {"dp": 4}),
    "megatron": ({"tp": 2}, {"dp": 2, "tp": 2}),
    "megatron-sp": ({"tp": 2}, {"dp": 2, "tp": 2}),
    "ilp": ({"tp": 2}, {"dp": 2, "tp": 2}),
    "propagate": ({"tp": 2}, {"dp": 2, "tp": 2}),
}


def one_process(model, x) -> np.ndarray:
    with torch.no_grad():
        return model.double()(x.double()).numpy()


def simulated(parallel, x) -> list[np.ndarray]:
    """Every rank's output, the ranks simulated in this process."""
    size = next(iter(parallel.per_rank.meshes.values())).size
    per_rank = [parallel.arguments(r, [x.numpy()]) for r in range(size)]
    (out,) = run_ranks(parallel.per_rank, [list(b) for b in zip(*per_rank, strict=True)])
    return out


def test_the_strategies_cover_the_registry() -> None:
    assert set(MESHES) == set(STRATEGIES)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_on_the_simulated_ranks(strategy) -> None:
    model, x = model_and_input("mlp")
    annotations = MEGATRON if strategy == "propagate" else None
    parallel = parallelize(model, MESHES[strategy][0], (x,), strategy, annotations=annotations)
    collectives = [op.name for op in parallel.per_rank["main"].ops if op.name.startswith("spmd.")]
    if strategy in ("megatron", "propagate"):  # column- then row-parallel: one all_reduce
        assert collectives == ["spmd.all_reduce"]
        assert parallel.plan["fc1_weight"] == parallel.plan["fc1_bias"]
    want = one_process(model, x)
    for rank, out in enumerate(simulated(parallel, x)):  # every rank holds the whole output
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5, err_msg=f"rank {rank}")


def test_megatron_places_an_nn_linear_weight_by_its_out_features() -> None:
    """nn.Linear keeps its weight [out, in] (a `transpose_b` matmul): the column-parallel
    weight is split on dim 0, the row-parallel one on dim 1, as the explicit placements."""
    model, x = model_and_input("mlp")
    plan = parallelize(model, {"tp": 2}, (x,), "megatron").plan
    explicit = parallelize(model, {"tp": 2}, (x,), MEGATRON).plan
    assert [(n, plan[n]) for n, _ in plan.entries] == list(explicit.entries)


MESH8 = {"dp": {"dp": 8}, "megatron": {"dp": 2, "tp": 4}, "megatron-sp": {"dp": 2, "tp": 4},
         "ilp": {"dp": 2, "tp": 4}}
IN_BLOCK = {  # Megatron's collectives inside a GPT-2 block, the output's gathers aside
    "megatron": {"spmd.all_reduce": 2},
    "megatron-sp": {"spmd.all_gather": 2, "spmd.reduce_scatter": 2},
}
EIGHT = [("gpt2", "megatron"), ("gpt2", "megatron-sp"), ("llama", "megatron")]


def in_block(fn) -> dict[str, int]:
    """The function's collectives by name, less the chains that make the outputs whole."""
    chain, later = set(), set(fn.outputs)
    for op in reversed(fn.ops):
        if op.name.startswith("spmd.") and op.result in later:
            chain.add(op)
            later.add(op.operands[0])
    found: dict[str, int] = {}
    for op in fn.ops:
        if op.name.startswith("spmd.") and op not in chain:
            found[op.name] = found.get(op.name, 0) + 1
    return found


@pytest.mark.parametrize("block, strategy", EIGHT if not FULL else
                         [(b, s) for b in ("gpt2", "llama") for s in MESH8])
def test_the_blocks_on_8_simulated_ranks(block, strategy) -> None:
    """dp=2 x tp=4 (dp=8 for dp), batch 8: the GPT-2 block under Megatron has exactly its 2
    all_reduces (TP+SP: 2 all_gathers, 2 reduce_scatters); the LLaMA block's 2 key/value heads
    do not split 4 ways, so its attention runs gathered. Every rank's output matches."""
    model, x = model_and_input(block, batch=8)
    parallel = parallelize(model, MESH8[strategy], (x,), strategy)
    if block == "gpt2" and strategy in IN_BLOCK:
        assert in_block(parallel.per_rank["main"]) == IN_BLOCK[strategy]
    want = one_process(model, x)
    for rank, out in enumerate(simulated(parallel, x)):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"rank {rank}")


def run_gloo(cases: list[tuple], folder: Path, world: int) -> None:
    """Parallelize each (block, strategy, mesh) here, run them all in one spawned job of
    `world` gloo processes, and compare every rank's output with the one-process model."""
    programs, wants = [], {}
    for block, strategy, mesh, *options in cases:  # options: parallelize's keywords
        model, x = model_and_input(block)
        parallel = parallelize(model, mesh, (x,), strategy, **(options[0] if options else {}))
        warm_kernels(parallel.per_rank)
        key = f"{block}-{strategy}"
        programs.append((key, block, parallel))
        wants[key] = one_process(model, x)
    for key, ranks in run_gloo_job(programs, world, folder).items():
        for rank, got in enumerate(ranks):
            np.testing.assert_allclose(got["out"], wants[key], rtol=1e-4, atol=1e-4,
                                       err_msg=f"{key} on rank {rank}")


@pytest.fixture
def one_thread(monkeypatch):
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "1")  # the ranks share this host's cores


def test_both_blocks_under_megatron_on_2_gloo_processes(tmp_path, one_thread) -> None:
    """The models are parallelized here once and handed to the processes (torch.export takes
    seconds; under torchrun each process would call parallelize itself). On tp=2 both blocks
    have exactly 2 all_reduces (the LLaMA block's 2 key/value heads split 2 ways)."""
    for block in ("gpt2", "llama"):
        model, x = model_and_input(block)
        per_rank = parallelize(model, {"tp": 2}, (x,), "megatron").per_rank
        assert in_block(per_rank["main"]) == IN_BLOCK["megatron"], block
    run_gloo([("gpt2", "megatron", {"tp": 2}), ("llama", "megatron", {"tp": 2}),
              ("mlp31", "megatron", {"tp": 2}, {"pad": True})], tmp_path, 2)


@pytest.mark.parametrize("tp", [2, 3])
def test_megatron_pads_an_odd_hidden_width_when_asked(tp) -> None:
    """fc1 31 wide on tp=2 or 3: without pad the template leaves it whole; with pad=True the
    column-parallel weight and bias are S(0,pad) (nn.Linear is [out, in]), the row-parallel
    one S(1,pad), and every simulated rank's output matches one process (the padding, NaN
    in the simulated blocks, never reaches fc2's sum)."""
    model, x = model_and_input("mlp31")
    plain = dict(parallelize(model, {"tp": tp}, (x,), "megatron").plan.entries)
    assert str(plain["fc1_weight"][0]) == "R"
    parallel = parallelize(model, {"tp": tp}, (x,), "megatron", pad=True)
    entries = {n: str(ps[0]) for n, ps in parallel.plan.entries}
    assert (entries["fc1_weight"], entries["fc1_bias"], entries["fc2_weight"]) == (
        "S(0,pad)", "S(0,pad)", "S(1,pad)")
    want = one_process(model, x)
    for rank, out in enumerate(simulated(parallel, x)):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"rank {rank}")


@pytest.mark.skipif(not FULL, reason="the full block matrix: set TILEFOLD_DIST_FULL=1")
@pytest.mark.parametrize("world", [2, 4])
def test_every_block_and_strategy_on_gloo_processes(tmp_path, one_thread, world) -> None:
    searched = ("dp", "megatron", "megatron-sp", "ilp")
    cases = [(b, s, MESHES[s][(2, 4).index(world)]) for b in ("gpt2", "llama") for s in searched]
    run_gloo(cases, tmp_path, world)


def test_bad_strategies_say_what_to_do() -> None:
    model, x = model_and_input("mlp")
    with pytest.raises(TilefoldError, match=r"no parameter or input 'fc3.weight' \(it has: "
                       r"fc1.weight, fc1.bias, fc2.weight, fc2.bias, x\)"):
        parallelize(model, {"tp": 2}, (x,), {"fc3.weight": "[S(0)]"})
    with pytest.raises(TilefoldError, match=r"fc1.weight \[S\(0\),R\] gives 2 placements for "
                       r"the 1 axes"):
        parallelize(model, {"tp": 2}, (x,), {"fc1.weight": "[S(0),R]"})
    with pytest.raises(TilefoldError, match=r"strategy 'gspmd' is not one of dp, ilp, "
                       r"megatron, megatron-sp, propagate, or a mapping"):
        parallelize(model, {"tp": 2}, (x,), "gspmd")
    with pytest.raises(TilefoldError, match=r"annotations are the 'propagate' strategy's"):
        parallelize(model, {"tp": 2}, (x,), "ilp", annotations=MEGATRON)
    with pytest.raises(TilefoldError, match=r"strategy 'megatron' needs a mesh axis named tp "
                       r"\(or a mesh of one axis\); mesh @m \[dp=2, mp=2\] has neither"):
        parallelize(model, {"dp": 2, "mp": 2}, (x,), "megatron")


class Branchy(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x - 1  # data-dependent control flow


def test_a_model_the_exporter_cannot_take_is_refused_with_what_to_do() -> None:
    with pytest.raises(TilefoldError, match=r"torch.export cannot take Branchy with inputs "
                       r"\[\(4, 8\)\]: .*Make its forward exportable"):
        parallelize(Branchy(), {"dp": 2}, (torch.randn(4, 8),))
