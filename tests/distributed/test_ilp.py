"""The ILP strategy's bars: under a memory limit that forces every weight matrix to be split
8 ways its plan costs at most 1.01x Megatron's; without one, GPT-2-medium at batch 8x1024 on
8 devices gets data parallelism; its objective is the modeled cost of the plan it returns;
search times (one block on 8 devices, a 32-layer LLaMA-8B graph on an (8, 8) mesh)."""

from __future__ import annotations

import time

import pytest

from tilefold.distributed import (
    AlphaBeta,
    BlockShape,
    Constraints,
    gpt2,
    llama,
    nbytes,
    parse_mesh,
    plan_cost,
    search,
)
from tilefold.distributed.strategies import ILP, StrategyError
from tilefold.distributed.strategies.ilp import TRAINING_STATE
from tilefold.ir.types import Replicate

MEDIUM = BlockShape(d=1024, heads=16, batch=8, seq=1024)


def memory(plan, module, training: bool) -> int:
    """What the ILP's memory row counts: parameters (4x in training) and the data."""
    x, *params = plan.place(module)["main"].args
    return nbytes(x.type) + sum(nbytes(a.type) for a in params) * (TRAINING_STATE if training
                                                                   else 1)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("training", [False, True])
def test_a_memory_limit_forcing_8_way_weights_costs_at_most_megatron(layers, training) -> None:
    module = gpt2(BlockShape(**{**MEDIUM.__dict__, "layers": layers}))
    mesh = parse_mesh("tp=8")
    cost = AlphaBeta(mesh)
    constraints = Constraints(training=training)
    megatron = search(module, mesh, "megatron", cost, constraints)
    # every matrix split 8 ways, the activations too: only the norms' vectors stay whole
    limit = memory(search(module, mesh, "megatron-sp", cost, constraints), module, training)
    for other in ("dp", "megatron"):
        assert memory(search(module, mesh, other, cost, constraints), module, training) > limit
    limited = Constraints(memory_limit=limit, training=training)
    ilp = ILP()
    plan = ilp.search(module, mesh, cost, limited)
    assert memory(plan, module, training) <= limit
    for a in module["main"].args[1:]:
        if a.type.rank == 2:
            assert plan[a.name] != (Replicate(),), a.name
    _, ilp_cost = plan_cost(plan, module, cost, constraints)
    _, megatron_cost = plan_cost(megatron, module, cost, constraints)
    assert ilp_cost.seconds <= 1.01 * megatron_cost.seconds
    assert ilp.objective == pytest.approx(ilp_cost.seconds, rel=1e-9)


@pytest.mark.parametrize("training", [False, True])
def test_gpt2_medium_without_a_limit_gets_data_parallel(training) -> None:
    module = gpt2(BlockShape(**{**MEDIUM.__dict__, "layers": 24}))
    mesh = parse_mesh("dp=8")
    constraints = Constraints(training=training)
    plan = search(module, mesh, "ilp", AlphaBeta(mesh), constraints)
    assert plan.entries == search(module, mesh, "dp", AlphaBeta(mesh), constraints).entries


def test_the_objective_is_the_modeled_cost_of_the_plan_with_shared_layers() -> None:
    # three layers share decisions; each layer's ops must still see their own operands
    module = llama(BlockShape(d=256, heads=8, kv_heads=4, ffn=512, batch=4, seq=64,
                              layers=3))
    mesh = parse_mesh("dp=2,tp=4")
    cost = AlphaBeta(mesh)
    for constraints in (Constraints(training=True), Constraints(memory_limit=3 << 20)):
        ilp = ILP()
        plan = ilp.search(module, mesh, cost, constraints)
        _, modeled = plan_cost(plan, module, cost, constraints)
        assert ilp.objective == pytest.approx(modeled.seconds, rel=1e-9)
        dp = search(module, mesh, "dp", cost, constraints)
        if constraints.memory_limit is None:
            assert modeled.seconds <= plan_cost(dp, module, cost, constraints)[1].seconds


def test_an_impossible_memory_limit_is_named() -> None:
    module = gpt2(BlockShape())
    with pytest.raises(StrategyError, match="ilp: no plan fits the constraints"):
        search(module, parse_mesh("tp=2"), "ilp", constraints=Constraints(memory_limit=1000))


@pytest.mark.timing
def test_search_times() -> None:
    mesh = parse_mesh("tp=8")
    block = gpt2(MEDIUM)
    start = time.perf_counter()
    search(block, mesh, "ilp", AlphaBeta(mesh))
    assert time.perf_counter() - start < 1.0
    shape = BlockShape(d=4096, heads=32, kv_heads=8, ffn=14336, batch=8, seq=4096, layers=32,
                       dtype="bf16")
    start = time.perf_counter()
    module = llama(shape)
    mesh = parse_mesh("dp=8,tp=8")
    constraints = Constraints(memory_limit=16 << 30, training=True)
    plan = search(module, mesh, "ilp", AlphaBeta(mesh), constraints)
    assert time.perf_counter() - start < 60.0
    assert memory(plan, module, True) <= 16 << 30


def test_an_axis_of_one_device_stays_replicated() -> None:
    module = gpt2(BlockShape(batch=4))
    mesh = parse_mesh("dp=1,tp=4")
    plan = search(module, mesh, "ilp", AlphaBeta(mesh), Constraints(memory_limit=200_000))
    assert all(ps[0] == Replicate() for _, ps in plan.entries)
    assert any(ps[1] != Replicate() for _, ps in plan.entries)
