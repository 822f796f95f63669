"""parallelize: an nn.Module's forward exported, placed by a strategy ("dp") or by explicit
Megatron placements on its parameters, partitioned, and run by 2 gloo processes (and by the
simulated ranks): every process's output matches the one-process model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.distributed.test_torchrun import free_port, warm_kernels
from tilefold.distributed import parallelize, run_ranks
from tilefold.errors import TilefoldError

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

MEGATRON = {"fc1.weight": "[S(0)]", "fc1.bias": "[S(0)]", "fc2.weight": "[S(1)]"}
CASES = [({"dp": 2}, "dp"), ({"tp": 2}, MEGATRON)]


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def model_and_input():
    """The same weights and input in every process."""
    torch.manual_seed(5)
    return MLP().eval(), torch.randn(8, 16)


def one_process(model, x) -> np.ndarray:
    with torch.no_grad():
        return model.double()(x.double()).numpy()


@pytest.mark.parametrize("mesh, strategy", CASES, ids=["dp", "megatron"])
def test_the_per_rank_program_and_the_simulated_ranks(mesh, strategy) -> None:
    model, x = model_and_input()
    parallel = parallelize(model, mesh, (x,), strategy)
    ops = [op.name for op in parallel.per_rank["main"].ops]
    assert [n for n in ops if n.startswith("spmd.")] == (
        ["spmd.all_gather"] if strategy == "dp" else ["spmd.all_reduce"])
    per_rank = [parallel.arguments(r, [x.numpy()]) for r in range(2)]
    (out,) = run_ranks(parallel.per_rank, [list(blocks) for blocks in zip(*per_rank,
                                                                          strict=True)])
    for rank in range(2):  # every rank holds the whole output
        np.testing.assert_allclose(out[rank], one_process(model, x), rtol=2e-5, atol=2e-5)


def _rank_main(rank: int, world: int, port: int, folder: str, parallel) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        _, x = model_and_input()
        np.save(Path(folder) / f"out{rank}.npy", parallel(x).numpy())
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_under_megatron_placements_match_one(tmp_path, monkeypatch) -> None:
    """The model is parallelized here once and handed to both processes (torch.export takes
    seconds; under torchrun each process would call parallelize itself), which run their rank.
    The DP path is the one the simulated-ranks test above checks, its all_gather the torchrun
    tests'."""
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "1")
    model, x = model_and_input()
    parallel = parallelize(model, {"tp": 2}, (x,), MEGATRON)
    warm_kernels(parallel.per_rank)
    mp.spawn(_rank_main, args=(2, free_port(), str(tmp_path), parallel), nprocs=2)
    want = one_process(model, x)
    for rank in range(2):
        got = np.load(tmp_path / f"out{rank}.npy")
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"rank {rank}")


def test_bad_strategies_say_what_the_model_has() -> None:
    model, x = model_and_input()
    with pytest.raises(TilefoldError, match=r"no parameter or input 'fc3.weight' \(it has: "
                       r"fc1.weight, fc1.bias, fc2.weight, fc2.bias, x\)"):
        parallelize(model, {"tp": 2}, (x,), {"fc3.weight": "[S(0)]"})
    with pytest.raises(TilefoldError, match=r"fc1.weight \[S\(0\),R\] gives 2 placements for "
                       r"the 1 axes"):
        parallelize(model, {"tp": 2}, (x,), {"fc1.weight": "[S(0),R]"})
    with pytest.raises(TilefoldError, match=r"strategy 'ilp' is not one of dp"):
        parallelize(model, {"tp": 2}, (x,), "ilp")
