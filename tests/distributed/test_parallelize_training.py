"""parallelize(training=True): the joint forward+backward graph of a model's loss, planned by
a strategy, partitioned, and run on the simulated ranks and by spawned gloo processes: the
loss and every parameter's gradient match plain torch autograd in float64 on one process.

By default the MLP runs under dp, megatron (tp=2 and dp=2 x tp=2), megatron-sp and ilp on the
simulated ranks, and under dp and megatron in one 2-rank gloo job; `TILEFOLD_DIST_FULL=1` adds
the GPT-2-style and the LLaMA-style block to both, on gloo under every strategy on 2 and on 4
processes (a few minutes on a 2-core host). MiniLM's fine-tuning step (`bench train`'s: ids,
mask and labels to a cross-entropy loss) runs under dp, simulated and in the 2-process gloo
job, on a small BERT config by default; MiniLM's own config joins the full gloo run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.distributed.gloo_job import run_gloo_job
from tests.distributed.test_torchrun import warm_kernels
from tests.distributed.torch_blocks import model_and_input
from tilefold.distributed import parallelize, run_ranks
from tilefold.errors import TilefoldError

torch = pytest.importorskip("torch")

FULL = os.environ.get("TILEFOLD_DIST_FULL") == "1"
MESH = {"dp": {"dp": 2}, "megatron": {"tp": 2}}
TOL = {"mlp": 2e-5, "gpt2": 1e-4, "llama": 1e-4, "minilm": 1e-4, "minilm-full": 1e-4}
OWN_LOSS = {"minilm", "minilm-full"}  # the model's output is its loss


def inputs_of(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def loss(y):
    """Half the mean over rows of the squared output, as a sum scaled by a constant (a sum of
    row partials stays a partial sum under data parallelism)."""
    return (y * y).sum() * (0.5 / y.shape[0])


def one_process(model, x, step_loss=loss) -> dict[str, np.ndarray]:
    """The loss (`step_loss` of the output; None: the output) and each parameter's gradient
    by plain torch autograd in float64."""
    m = model.double()
    m.zero_grad()
    out = m(*[t.double() if t.is_floating_point() else t for t in inputs_of(x)])
    value = out if step_loss is None else step_loss(out)
    value.backward()
    return {"loss": value.detach().numpy(), **{n: p.grad.numpy() for n, p in
                                                m.named_parameters()}}


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float,
            where: str) -> None:
    assert set(got) == set(want), where
    for name, w in want.items():  # the gradients are O(1..100): a relative bound on each
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(got[name], w, rtol=tol, atol=tol * scale,
                                   err_msg=f"{name} ({where})")


def simulated(parallel, x) -> list[dict[str, np.ndarray]]:
    size = next(iter(parallel.per_rank.meshes.values())).size
    per_rank = [parallel.arguments(r, [t.numpy() for t in inputs_of(x)]) for r in range(size)]
    outs = run_ranks(parallel.per_rank, [list(b) for b in zip(*per_rank, strict=True)])
    names = ["loss", *parallel.gradients]
    return [{n: o[r] for n, o in zip(names, outs, strict=True)} for r in range(size)]


SIMULATED = [("dp", {"dp": 2}), ("megatron", {"tp": 2}), ("megatron", {"dp": 2, "tp": 2}),
             ("megatron-sp", {"tp": 2}), ("ilp", {"dp": 2, "tp": 2}), ("dp", {"dp": 8}),
             ("megatron", {"dp": 2, "tp": 4}), ("megatron-sp", {"dp": 2, "tp": 4})]


def train(block: str, strategy: str, mesh: dict | None = None):
    model, x = model_and_input(block)
    return parallelize(model, mesh or MESH[strategy], inputs_of(x), strategy, training=True,
                       loss=None if block in OWN_LOSS else loss)


@pytest.mark.parametrize("block", ["mlp", *(["gpt2", "llama"] if FULL else [])])
@pytest.mark.parametrize("strategy, mesh", SIMULATED,
                         ids=[f"{s}-{'x'.join(f'{a}{n}' for a, n in m.items())}"
                              for s, m in SIMULATED])
def test_the_training_step_on_the_simulated_ranks(block, strategy, mesh) -> None:
    parallel = train(block, strategy, mesh)
    model, x = model_and_input(block)
    want = one_process(model, x)
    for rank, got in enumerate(simulated(parallel, x)):
        compare(got, want, TOL[block], f"{block} {strategy} rank {rank}")


def test_data_parallel_gradients_are_all_reduced_partial_sums() -> None:
    """Under dp every gradient (and the loss) is a sum over the ranks' rows: propagation makes
    each a P(sum), and the only collectives are their all_reduces, no gathers; these small
    ones leave partitioning as one bucket (bucket-all-reduces), as DDP sends them."""
    parallel = train("mlp", "dp")
    placed = [op.name for op in parallel.placed["main"].ops if "collective" in op.opdef.traits]
    assert placed == ["all_reduce"] * (1 + len(parallel.gradients))
    collectives = [op.name for op in parallel.per_rank["main"].ops if op.name.startswith("spmd")]
    assert collectives == ["spmd.all_reduce"]
    assert parallel.gradients == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def test_megatron_splits_the_weights_of_the_joint_graph() -> None:
    plan = train("mlp", "megatron").plan
    assert [str(plan[n][0]) for n in ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")] == [
        "S(0)", "S(0)", "S(1)", "R"]


def run_gloo(cases: list[tuple[str, str, dict]], folder: Path) -> None:
    """Each (block, strategy, mesh) parallelized here; those of one world size run in one
    spawned job of that many processes."""
    by_world: dict[int, list] = {}
    wants = {}
    for block, strategy, mesh in cases:
        parallel = train(block, strategy, mesh)
        warm_kernels(parallel.per_rank)
        key = f"{block}-{strategy}-{'x'.join(f'{a}{n}' for a, n in mesh.items())}"
        by_world.setdefault(int(np.prod(list(mesh.values()))), []).append(
            (key, block, parallel))
        wants[key] = one_process(*model_and_input(block),
                                 step_loss=None if block in OWN_LOSS else loss)
    for world, programs in by_world.items():
        for (key, block, _), ranks in zip(programs, run_gloo_job(programs, world, folder).values(),
                                          strict=True):
            for rank, got in enumerate(ranks):
                compare(got, wants[key], TOL[block], f"{key} on gloo rank {rank}")


@pytest.fixture
def one_thread(monkeypatch):
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "1")  # the ranks share this host's cores


def test_the_mlp_and_minilm_training_steps_on_2_gloo_processes(tmp_path, one_thread) -> None:
    """The MLP under dp and megatron, and MiniLM's fine-tuning step (embeddings, padded
    attention mask, GELU, layer norms, the masked mean and the cross-entropy) under dp, in
    one 2-process gloo job: the loss and every gradient, the embedding tables' scatter-added
    ones among them, match one process."""
    run_gloo([("mlp", "dp", MESH["dp"]), ("mlp", "megatron", MESH["megatron"]),
              ("minilm", "dp", MESH["dp"])], tmp_path)


def test_the_minilm_step_traces_through_its_mask_check() -> None:
    """transformers skips an all-ones mask by reading `mask.all()` in Python, which the
    joint trace cannot: the step is traced from torch.export's forward instead, and the dp
    gradients on the simulated ranks match autograd's (the padded rows' mask applied)."""
    parallel = train("minilm", "dp")
    assert "encoder.embeddings.word_embeddings.weight" in parallel.gradients
    model, x = model_and_input("minilm")
    want = one_process(model, x, step_loss=None)
    for rank, got in enumerate(simulated(parallel, x)):
        compare(got, want, TOL["minilm"], f"minilm dp rank {rank}")


# The full matrix: every strategy on 2 processes, and on 4 (dp=4 for data parallelism alone,
# else dp=2 x tp=2).
GLOO_FULL = [(s, m) for s, m in [("dp", {"dp": 2}), ("megatron", {"tp": 2}),
                                 ("megatron-sp", {"tp": 2}), ("ilp", {"tp": 2}),
                                 ("dp", {"dp": 4}), ("megatron", {"dp": 2, "tp": 2}),
                                 ("megatron-sp", {"dp": 2, "tp": 2}),
                                 ("ilp", {"dp": 2, "tp": 2})]]


@pytest.mark.skipif(not FULL, reason="the blocks' training steps: set TILEFOLD_DIST_FULL=1")
def test_the_blocks_training_steps_on_2_and_4_gloo_processes(tmp_path, one_thread) -> None:
    run_gloo([(b, s, m) for b in ("gpt2", "llama") for s, m in GLOO_FULL]
             + [("minilm-full", "dp", MESH["dp"])], tmp_path)


def test_a_training_step_needs_a_scalar_loss_and_parameters() -> None:
    model, x = model_and_input("mlp")
    with pytest.raises(TilefoldError, match=r"the loss must be one scalar tensor, but MLP "
                       r"output is \(8, 16\); pass loss=fn"):
        parallelize(model, {"dp": 2}, (x,), "dp", training=True)
    with pytest.raises(TilefoldError, match=r"a loss is for the training step"):
        parallelize(model, {"dp": 2}, (x,), "dp", loss=loss)
    with pytest.raises(TilefoldError, match=r"Identity has no parameter that requires grad"):
        parallelize(torch.nn.Identity(), {"dp": 2}, (x,), "dp", training=True, loss=loss)


class Frozen(torch.nn.Module):
    """A frozen bias and a buffer: inputs of the step, not differentiated."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)
        self.fc.bias.requires_grad_(False)
        self.register_buffer("scale", torch.randn(8))

    def forward(self, x):
        return torch.tanh(self.fc(x)) * self.scale


def test_frozen_parameters_and_buffers_enter_the_step_without_gradients() -> None:
    torch.manual_seed(6)
    model, x = Frozen(), torch.randn(8, 16)
    parallel = parallelize(model, {"dp": 2}, (x,), "dp", training=True, loss=loss)
    assert parallel.gradients == ["fc.weight"]
    args = [a.name for a in parallel.placed["main"].args]  # arguments, not baked constants
    assert args == ["fc_weight", "fc_bias", "scale", "x"]
    m = model.double()
    value = loss(m(x.double()))
    value.backward()
    want = {"loss": value.detach().numpy(), "fc.weight": m.fc.weight.grad.numpy()}
    for rank, got in enumerate(simulated(parallel, x)):
        compare(got, want, 2e-5, f"rank {rank}")


class WithLoss(torch.nn.Module):
    """A model whose forward is its own loss (no loss function needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return loss(torch.tanh(self.fc(x)))


def test_a_scalar_output_is_the_loss() -> None:
    torch.manual_seed(9)
    model, x = WithLoss(), torch.randn(8, 16)
    parallel = parallelize(model, {"dp": 2}, (x,), {"x": "[S(0)]"}, training=True)
    m = model.double()
    value = m(x.double())
    value.backward()
    want = {"loss": value.detach().numpy(), "fc.weight": m.fc.weight.grad.numpy(),
            "fc.bias": m.fc.bias.grad.numpy()}
    for rank, got in enumerate(simulated(parallel, x)):
        compare(got, want, 2e-5, f"rank {rank}")


def test_a_padded_training_step_matches_one_process() -> None:
    """An MLP 31 wide on tp=3 with pad=True: fc1 and fc2 split padded, and the backward's
    contractions over the hidden dim (the input's gradient) mask the padding as the forward's
    do: loss and every gradient match autograd on every simulated rank."""
    model, x = model_and_input("mlp31")
    parallel = parallelize(model, {"tp": 3}, (x,), "megatron", training=True, loss=loss,
                           pad=True)
    assert str(dict(parallel.plan.entries)["fc2_weight"][0]) == "S(1,pad)"
    want = one_process(model, x)
    for rank, got in enumerate(simulated(parallel, x)):
        compare(got, want, TOL["mlp"], f"mlp31 padded rank {rank}")
