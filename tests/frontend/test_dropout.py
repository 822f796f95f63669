"""Dropout and random tensors in training, strict: the mask is drawn natively from the graph's
seed (`random_uniform`), a new seed from PyTorch's generator each call.

The oracle knows the seed: after `torch.manual_seed(k)` the compiled forward's first draw is
`converter.draw_seed()`'s after the same `manual_seed(k)`, and each dropout site's mask is
`uniform(seed, stream) >= p` (streams in graph order). So the compiled step is compared with
float64 eager applying those very masks, loss and gradients, within `tests/tolerances.py`.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from frontend_helpers import assert_native
from tolerances import assert_close

from tilefold.frontend import report
from tilefold.frontend.converter import draw_seed
from tilefold.ir.ops.random import uniform


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    report.REPORTS.clear()
    torch.manual_seed(0)


class Net(torch.nn.Module):
    """Linear - dropout - GELU - dropout - Linear, with its loss."""

    def __init__(self, p0: float, p1: float):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(13, 33), torch.nn.Linear(33, 7)
        self.p0, self.p1 = p0, p1

    def forward(self, x, target, masks=None):
        h = self.fc1(x)
        h = F.dropout(h, self.p0) if masks is None else h * masks[0] / (1 - self.p0)
        h = F.gelu(h)
        h = F.dropout(h, self.p1) if masks is None else h * masks[1] / (1 - self.p1)
        return F.mse_loss(self.fc2(h), target)


def _masks(seed: int, shapes: list, ps: list) -> list:
    return [torch.from_numpy(uniform(seed, k, math.prod(s)).reshape(s) >= p).double()
            for k, (s, p) in enumerate(zip(shapes, ps, strict=True))]


@pytest.mark.parametrize("batch", [1, 6])
def test_training_step_with_dropout_matches_eager_with_the_drawn_masks(batch):
    net = Net(0.25, 0.5).train()
    oracle = copy.deepcopy(net).double()
    compiled = torch.compile(net, backend="tilefold", options={"strict": True})
    x, target = torch.randn(batch, 3, 13), torch.randn(batch, 3, 7)
    for step in range(3):  # each call draws new masks
        torch.manual_seed(100 + step)
        seed = int(draw_seed())
        torch.manual_seed(100 + step)
        net.zero_grad()
        loss = compiled(x, target)
        loss.backward()
        masks = _masks(seed, [(batch, 3, 33)] * 2, [0.25, 0.5])
        oracle.zero_grad()
        want = oracle(x.double(), target.double(), masks)
        want.backward()
        reduced = 13 + 33 + 2 * 3 * batch
        assert_close(loss.detach().numpy(), want.detach().numpy(), dtype="f32", reduced=reduced)
        scale = max(float(p.grad.abs().max()) for p in oracle.parameters())
        for got, ref in zip(net.parameters(), oracle.parameters(), strict=True):
            assert_close(got.grad.numpy() / scale, ref.grad.numpy() / scale, dtype="f32",
                         reduced=reduced)
    graphs = report.reports()
    assert {"forward", "backward"} <= {g.graph.rsplit(" ", 1)[-1] for g in graphs}
    assert_native(graphs, {"matmul"})
    assert all(not g.fallback and g.fallback_nodes == 0 for g in graphs)


def test_dropout_keeps_its_share_scaled_and_draws_anew_each_call():
    p = 0.3
    fn = torch.compile(lambda x: F.dropout(x, p, training=True), backend="tilefold",
                       options={"strict": True})
    x = torch.rand(64, 1031) + 0.5  # no zeros: a zero output is a dropped element
    first = fn(x)
    kept = first != 0
    n = x.numel()
    assert abs(kept.double().mean().item() - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n)
    assert torch.equal(first[kept], x[kept] * torch.tensor(1 / (1 - p), dtype=torch.float32))
    second = fn(x)
    assert not torch.equal(second != 0, kept)  # a new seed, new mask
    torch.manual_seed(7)
    a = fn(x)
    torch.manual_seed(7)
    assert torch.equal(fn(x), a)  # PyTorch's generator decides the seed: a run repeats


def test_rand_like_is_uniform_and_native():
    fn = torch.compile(lambda x: torch.rand_like(x) * 2 + x, backend="tilefold",
                       options={"strict": True})
    x = torch.zeros(257, 129)
    u = (fn(x) / 2).double()
    assert u.min().item() >= 0 and u.max().item() < 1
    assert abs(u.mean().item() - 0.5) < 6 * math.sqrt(1 / 12 / u.numel())
    assert not torch.equal(fn(x), fn(x))


def test_bert_fine_tuning_with_dropout_runs_native():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config).train()  # dropout 0.1
    ids = torch.randint(0, 101, (4, 16))
    labels = torch.tensor([0, 1, 2, 1])
    step = torch.compile(lambda i, y: model(input_ids=i, labels=y).loss, backend="tilefold",
                         options={"strict": True})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(12):
        opt.zero_grad()
        loss = step(ids, labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and np.mean(losses[-3:]) < np.mean(losses[:3])
    graphs = report.reports()
    assert {"forward", "backward"} <= {g.graph.rsplit(" ", 1)[-1] for g in graphs}
    for g in graphs:
        assert not g.fallback and g.fallback_nodes == 0, g.format()
