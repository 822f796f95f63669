"""Training through torch.compile(backend="tilefold"), strict: AOTAutograd's forward and
backward graphs both lowered natively (`frontend/training.py`).

Each test runs a model with its loss inside the compiled function, calls backward, and
compares the loss and the gradient of every parameter (and of a float input) with the same
model run eagerly in float64 from the same weights. The tolerance is `tests/tolerances.py`'s
rule for float32 with `reduced` the sum of the reduction lengths a gradient's error passes
through: each layer's sums add their own rounding (relative to their terms) on top of what
reaches them, so along a chain of L reductions of lengths n_1..n_L the bounds add up
(first order). Gradients are compared in units of the model's largest gradient element, the
size of the terms the backward pass sums: a gradient that is zero in exact arithmetic (BERT's
key bias: softmax ignores a shift shared by every key) is its terms' rounding, not zero.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from frontend_helpers import assert_native
from tolerances import assert_close, tolerance

from tilefold.frontend import report, training

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    report.REPORTS.clear()
    torch.manual_seed(0)


class WithLoss(torch.nn.Module):
    """The model and its loss as one module, so the loss is in the compiled graph too."""

    def __init__(self, model: torch.nn.Module, loss):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *inputs):
        *xs, target = inputs
        return self.loss(self.model(*xs), target)


def _grads(module: torch.nn.Module, inputs: list) -> list:
    return [p.grad for p in module.parameters()] + [
        x.grad for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]


def _double(inputs: list) -> list:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.detach().double().requires_grad_(x.requires_grad)
        out.append(x)
    return out


def train_and_compare(module: torch.nn.Module, inputs: list, reduced: int) -> torch.nn.Module:
    """One forward+backward of `module(*inputs)` (a scalar loss) compiled strict, against the
    float64 eager oracle; returns the compiled module."""
    oracle = copy.deepcopy(module).double()
    compiled = torch.compile(module, backend="tilefold", options={"strict": True})
    loss = compiled(*inputs)
    loss.backward()
    inputs64 = _double(inputs)
    want = oracle(*inputs64)
    want.backward()
    assert_close(loss.detach().numpy(), want.detach().numpy(), dtype="f32", reduced=reduced)
    got_grads, want_grads = _grads(module, inputs), _grads(oracle, inputs64)
    assert len(got_grads) == len(want_grads) and got_grads
    names = [n for n, _ in module.named_parameters()] + ["input"] * (len(got_grads) -
                                                                   len(list(module.parameters())))
    scale = max(float(w.abs().max()) for w in want_grads if w is not None)
    for name, g, w in zip(names, got_grads, want_grads, strict=True):
        if w is None:  # a parameter the loss does not reach (e.g. BERT's pooler)
            assert g is None or not g.any(), name
            continue
        assert g is not None, f"{name}: no gradient"
        w = w.detach().numpy()
        try:
            assert_close(g.numpy() / scale, w / scale, dtype="f32", reduced=reduced)
        except AssertionError as exc:
            raise AssertionError(f"gradient of {name}: {exc}") from None
    _assert_training_native()
    return module


def _assert_training_native() -> None:
    graphs = report.reports()
    parts = {g.graph.rsplit(" ", 1)[-1] for g in graphs}
    assert {"forward", "backward"} <= parts, [g.graph for g in graphs]
    assert_native(graphs, {"matmul"})
    for g in graphs:
        assert not g.fallback and g.fallback_nodes == 0, g.format()


class Block(torch.nn.Module):
    """Linear - GELU - Linear - LayerNorm."""

    def __init__(self, d_in: int = 13, hidden: int = 33, d_out: int = 7):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d_in, hidden), torch.nn.Linear(hidden, d_out)
        self.norm = torch.nn.LayerNorm(d_out)

    def forward(self, x):
        return self.norm(self.fc2(F.gelu(self.fc1(x))))


@pytest.mark.parametrize("batch", [1, 5])
def test_linear_gelu_linear_layernorm_with_mse(batch: int) -> None:
    x = torch.randn(batch, 3, 13, requires_grad=True)
    target = torch.randn(batch, 3, 7)
    # reductions on a gradient's path: fc1 (13), fc2 (33), the norm (7), the batch (3 b) twice
    train_and_compare(WithLoss(Block(), F.mse_loss), [x, target],
                      reduced=13 + 33 + 7 + 2 * 3 * batch)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in
                                          [(13, 33), (33, 33), (33, 33), (33, 33), (33, 7)])

    def forward(self, x):
        acts = [F.relu, F.silu, torch.tanh, torch.sigmoid]
        for layer, act in zip(self.layers[:-1], acts, strict=True):
            x = act(layer(x))
        return self.layers[-1](x)


def test_mlp_with_relu_silu_tanh_sigmoid() -> None:
    x = torch.randn(7, 13, requires_grad=True)
    target = torch.randn(7, 7)
    train_and_compare(WithLoss(MLP(), F.mse_loss), [x, target], reduced=13 + 4 * 33 + 2 * 7)


class Classifier(torch.nn.Module):
    def __init__(self, log: bool):
        super().__init__()
        self.fc, self.head = torch.nn.Linear(13, 33), torch.nn.Linear(33, 7)
        self.log = log

    def forward(self, x):
        h = self.fc(x).softmax(-1)  # softmax's backward, in the middle of the network
        logits = self.head(h)
        return logits.log_softmax(-1) if self.log else logits


@pytest.mark.parametrize("loss", ["nll", "cross_entropy"])
def test_softmax_log_softmax_and_nll_cross_entropy(loss: str) -> None:
    x = torch.randn(13, 13, requires_grad=True)
    labels = torch.randint(0, 7, (13,))
    fn = F.nll_loss if loss == "nll" else F.cross_entropy
    train_and_compare(WithLoss(Classifier(log=loss == "nll"), fn), [x, labels],
                      reduced=13 + 33 + 2 * 33 + 7 + 13)


class EmbedNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(33, 13)
        self.norm = torch.nn.LayerNorm(13)
        self.out = torch.nn.Linear(13, 7)

    def forward(self, ids):
        return self.out(self.norm(self.embed(ids)))


def test_embedding_and_layer_norm() -> None:
    ids = torch.tensor([[3, 7, 3, 0, 32, 7, 1], [5, 5, 5, 2, 9, 31, 3]])  # repeated rows
    target = torch.randn(2, 7, 7)
    # the embedding's gradient sums the rows of every repeated id (up to 14)
    train_and_compare(WithLoss(EmbedNorm(), F.mse_loss), [ids, target],
                      reduced=13 + 7 + 2 * 14 + 13)


class Attention(torch.nn.Module):
    def __init__(self, dim: int = 26, heads: int = 2, causal: bool = True):
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.heads, self.causal = heads, causal

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=self.causal)
        return x + self.proj(o.transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize(("batch", "causal"), [(1, True), (2, False)])
def test_attention_block(batch: int, causal: bool) -> None:
    x = torch.randn(batch, 7, 26, requires_grad=True)
    target = torch.randn(batch, 7, 26)
    train_and_compare(WithLoss(Attention(causal=causal), F.mse_loss), [x, target],
                      reduced=26 + 3 * 13 + 2 * 7 + 26 + 2 * 7 * batch)


BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 37, "vocab_size": 99, "max_position_embeddings": 32}


class BertLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = transformers.BertModel(transformers.BertConfig(**BERT)).eval()

    def forward(self, ids, mask, target):
        hidden = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        return F.mse_loss(hidden, target)


def test_tiny_bert() -> None:
    ids = torch.randint(0, 99, (2, 13))
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, 9:] = 0  # padding
    target = torch.randn(2, 13, 32)
    # per layer: attention (32, 13, 13), the FFN (32, 37), two norms (32); the batch
    layer = 32 + 13 + 13 + 32 + 37 + 2 * 32
    train_and_compare(BertLoss(), [ids, mask, target], reduced=2 * layer + 32 + 2 * 26)


class GPT2Loss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=99,
                                         n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        self.gpt2 = transformers.GPT2LMHeadModel(config).eval()

    def forward(self, ids):
        return self.gpt2(input_ids=ids, labels=ids).loss


def test_gpt2_lm_loss() -> None:
    ids = torch.randint(0, 99, (1, 33))
    layer = 32 + 33 + 33 + 32 + 128 + 2 * 32
    module = GPT2Loss()
    train_and_compare(WithLoss(module, lambda loss, _: loss), [ids, None],
                      reduced=2 * layer + 2 * 32 + 99 + 2 * 33)


def test_steps_with_updated_parameters_reuse_the_graphs() -> None:
    """Five SGD steps (then five AdamW steps): the parameters are arguments, so no step after
    the first traces or lowers again, and each step's loss matches the float64 model trained
    alike. A step's parameters differ from the oracle's by the rounding of the earlier steps'
    gradients (times the learning rate), so the bound grows by one gradient's tolerance a step."""
    x = torch.randn(5, 3, 13)
    target = torch.randn(5, 3, 7)
    module = WithLoss(Block(), F.mse_loss)
    oracle = copy.deepcopy(module).double()
    compiled = torch.compile(module, backend="tilefold", options={"strict": True})
    reduced = 13 + 33 + 7 + 2 * 15
    eps = tolerance("f32", reduced)["rtol"]
    for make in (lambda ps: torch.optim.SGD(ps, lr=0.1),
                 lambda ps: torch.optim.AdamW(ps, lr=1e-2)):
        opt, opt64 = make(module.parameters()), make(oracle.parameters())
        losses, wanted = [], []
        for _ in range(5):
            for o in (opt, opt64):
                o.zero_grad()
            loss = compiled(x, target)
            loss.backward()
            opt.step()
            want = oracle(x.double(), target.double())
            want.backward()
            opt64.step()
            losses.append(loss.item())
            wanted.append(want.item())
        assert wanted[-1] < wanted[0]  # it trains
        for step, (got, want) in enumerate(zip(losses, wanted, strict=True)):
            # Adam divides by sqrt(v): a gradient's relative error passes into the update
            bound = eps * (1 + step) * (abs(want) + 1)
            assert abs(got - want) <= bound, (step, got, want, bound)
    graphs = report.reports()
    assert sorted(g.graph.split()[-1] for g in graphs) == ["backward", "forward"], graphs
    for g in graphs:  # the runner lowered once and never again
        assert g.executors and all(e.watch == [] for e in g.executors)
    _assert_training_native()


def test_strict_training_names_the_op_pytorch_would_run() -> None:
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(13, 7)

        def forward(self, x):
            return torch.cumprod(self.fc(x), -1).sum()  # no tilefold rule

    compiled = torch.compile(Odd(), backend="tilefold", options={"strict": True})
    with pytest.raises(Exception, match="cumprod"):
        compiled(torch.randn(3, 13, requires_grad=True))


def test_non_strict_training_partitions_out_what_tilefold_cannot_run(allow_fallback) -> None:
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(13, 7)

        def forward(self, x):
            return torch.cumprod(self.fc(x), -1).sum()

    model = Odd()
    x = torch.randn(3, 13, requires_grad=True)
    compiled = torch.compile(model, backend="tilefold", options={"strict": False})
    compiled(x).backward()
    got = [model.fc.weight.grad.clone(), x.grad.clone()]
    model.zero_grad()
    x.grad = None
    model(x).backward()
    for g, w in zip(got, [model.fc.weight.grad, x.grad], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    forward = next(g for g in report.reports() if g.graph.endswith("forward"))
    assert forward.mode == "partitioned" and "aten.cumprod.default" in forward.fallback


def test_several_forwards_before_one_backward() -> None:
    """Gradient accumulation: three forwards keep their saved tensors apart (no call's outputs
    overwrite another's) and one backward through all of them matches float64."""
    module = WithLoss(Block(), F.mse_loss)
    oracle = copy.deepcopy(module).double()
    compiled = torch.compile(module, backend="tilefold", options={"strict": True})
    xs = [torch.randn(5, 3, 13) for _ in range(3)]
    targets = [torch.randn(5, 3, 7) for _ in range(3)]
    loss = sum((i + 1) * compiled(x, t) for i, (x, t) in enumerate(zip(xs, targets,
                                                                         strict=True)))
    loss.backward()
    want = sum((i + 1) * oracle(x.double(), t.double())
               for i, (x, t) in enumerate(zip(xs, targets, strict=True)))
    want.backward()
    reduced = 13 + 33 + 7 + 2 * 15 + 3
    assert_close(loss.detach().numpy(), want.detach().numpy(), dtype="f32", reduced=reduced)
    scale = max(float(p.grad.abs().max()) for p in oracle.parameters())
    for p, q in zip(module.parameters(), oracle.parameters(), strict=True):
        assert_close(p.grad.numpy() / scale, q.grad.numpy() / scale, dtype="f32",
                     reduced=reduced)
    _assert_training_native()


def test_micro_batches_under_compiled_autograd_accumulate_natively() -> None:
    """Compiled autograd hands the backend the gradient accumulation: the first micro-batch's
    backward makes each `.grad` (`new_empty_strided`, then a copy), the second adds into it;
    both backward graphs lower whole, strict, and the sums match float64."""
    module = WithLoss(Block(), F.mse_loss)
    oracle = copy.deepcopy(module).double()
    compiled = torch.compile(module, backend="tilefold", options={"strict": True})
    xs = [torch.randn(5, 3, 13) for _ in range(2)]
    targets = [torch.randn(5, 3, 7) for _ in range(2)]
    torch._dynamo.config.compiled_autograd = True
    try:
        for x, t in zip(xs, targets, strict=True):
            loss = compiled(x, t)
            torch.compile(lambda: loss.backward(), backend="tilefold",  # noqa: B023
                          options={"strict": True})()
    finally:
        torch._dynamo.config.compiled_autograd = False
    for x, t in zip(xs, targets, strict=True):
        oracle(x.double(), t.double()).backward()
    reduced = 2 * (13 + 33 + 7 + 2 * 15)
    scale = max(float(p.grad.abs().max()) for p in oracle.parameters())
    for p, q in zip(module.parameters(), oracle.parameters(), strict=True):
        assert_close(p.grad.numpy() / scale, q.grad.numpy() / scale, dtype="f32",
                     reduced=reduced)
    graphs = report.reports()
    assert any(g.lowered.get("aten.new_empty_strided.default") for g in graphs), graphs
    for g in graphs:
        assert g.mode == "tilefold" and not g.fallback, g.format()


def test_batch_norm_in_training_mode_updates_its_running_statistics() -> None:
    """Batch statistics in the forward, their backward, and the running mean and variance
    written back into the module's buffers, three steps against float64."""
    module = torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.BatchNorm1d(7),
                                 torch.nn.Linear(7, 3)).train()
    oracle = copy.deepcopy(module).double()
    compiled = torch.compile(module, backend="tilefold", options={"strict": True})
    reduced = 13 + 2 * 33 + 7 + 3
    for _ in range(3):
        x = torch.randn(33, 13)
        loss = compiled(x).square().mean()
        loss.backward()
        want = oracle(x.double()).square().mean()
        want.backward()
        assert_close(loss.detach().numpy(), want.detach().numpy(), dtype="f32", reduced=reduced)
    bn, bn64 = module[1], oracle[1]
    for got, want in [(bn.running_mean, bn64.running_mean), (bn.running_var, bn64.running_var),
                      *((p.grad, q.grad) for p, q in zip(module.parameters(),
                                                         oracle.parameters(), strict=True))]:
        assert_close(got.numpy(), want.detach().numpy(), dtype="f32", reduced=reduced)
    assert int(bn.num_batches_tracked) == 3
    _assert_training_native()


def test_new_batch_sizes_train_through_symbolic_graphs() -> None:
    """After a second batch size Dynamo traces with a symbolic batch: AOTAutograd's forward
    then returns sizes for the backward (`7*s0`, a product of symbols), which the runner gives
    back as ints. Every step's gradients match float64."""
    module = WithLoss(Block(), F.mse_loss)
    oracle = copy.deepcopy(module).double()
    compiled = torch.compile(module, backend="tilefold", options={"strict": True})
    for batch in (5, 7, 9):
        x, target = torch.randn(batch, 3, 13), torch.randn(batch, 3, 7)
        for m in (module, oracle):
            m.zero_grad()
        compiled(x, target).backward()
        oracle(x.double(), target.double()).backward()
        reduced = 13 + 33 + 7 + 2 * 3 * batch
        scale = max(float(p.grad.abs().max()) for p in oracle.parameters())
        for p, q in zip(module.parameters(), oracle.parameters(), strict=True):
            assert_close(p.grad.numpy() / scale, q.grad.numpy() / scale, dtype="f32",
                         reduced=reduced)
    assert any(g.symbolic_dims for g in report.reports())
    _assert_training_native()


def test_a_step_keeps_nothing_of_its_tensors_alive() -> None:
    """Once a step's loss is gone, its input and the activations saved from it are freed: the
    compiled graphs hold no array of a call's inputs for the next one (a held array keeps its
    tensor's memory: the backward's inputs are the forward's saved activations) and record no
    replay (whose result buffers, the size of every saved activation, would stay too)."""
    import gc
    import weakref

    module = WithLoss(Block(), F.mse_loss)
    compiled = torch.compile(module, backend="tilefold", options={"strict": True})
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    target = torch.randn(5, 3, 7)
    for _ in range(3):  # the third call would replay a recording of the second
        x = torch.randn(5, 3, 13)
        opt.zero_grad()
        loss = compiled(x, target)
        loss.backward()
        opt.step()
        gone = weakref.ref(x)
        del x, loss
        gc.collect()
        assert gone() is None, "a compiled graph keeps the step's input alive"
    for g in report.reports():
        for e in g.executors:
            plans = e.runner.run.compiled._plans.values()
            assert plans and all(p.replay is None and not p.last_inputs for p in plans), g.graph
    _assert_training_native()


def test_forward_and_backward_take_turns_with_one_set_of_buffers(monkeypatch) -> None:
    """The forward's and the backward's plans take their intermediates from one
    `SharedBuffers` (they never run at once): the pool holds less than the two plans use,
    each laying its buffers out from the pool's start whatever their shapes."""
    monkeypatch.setattr(training, "_POOL", None)  # a pool of this test's graphs alone
    module = WithLoss(MLP(), F.mse_loss)
    x = torch.randn(64, 13, requires_grad=True)
    train_and_compare(module, [x, torch.randn(64, 7)], reduced=13 + 4 * 33 + 2 * 7)
    compiled = [e.runner.run.compiled for g in report.reports() for e in g.executors]
    assert len(compiled) == 2
    shared = compiled[0].shared
    assert shared is not None and all(c.shared is shared for c in compiled)
    used = [p.shared_bytes for c in compiled for p in c._plans.values()]
    assert len(used) == 2 and min(used) > 0
    assert max(used) <= shared.held < sum(used), (shared.held, used)


class Broken(torch.nn.Module):
    """The MLP with a graph break between its layers: Dynamo graphs on either side."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        x = F.relu(self.mlp.layers[0](x))
        torch._dynamo.graph_break()
        for layer in self.mlp.layers[1:-1]:
            x = torch.tanh(layer(x))
        return self.mlp.layers[-1](x)


def test_the_pieces_of_a_graph_break_share_one_pool(monkeypatch) -> None:
    """Every training graph of a step takes its intermediates from one pool (a step runs
    them one at a time), each plan's buffers laid from its start: the pool holds what the
    largest plan uses, not the sum of the pieces' (GPT-2's transformer and loss graphs)."""
    monkeypatch.setattr(training, "_POOL", None)  # a pool of this test's graphs alone
    x = torch.randn(64, 13, requires_grad=True)
    train_and_compare(WithLoss(Broken(), F.mse_loss), [x, torch.randn(64, 7)],
                      reduced=13 + 4 * 33 + 2 * 7)
    compiled = [e.runner.run.compiled for g in report.reports() for e in g.executors]
    assert len(compiled) >= 4  # a forward and a backward per piece
    shared = compiled[0].shared
    assert shared is not None and all(c.shared is shared for c in compiled)
    used = [p.shared_bytes for c in compiled for p in c._plans.values()]
    assert max(used) == shared.held, (shared.held, used)


def test_saved_weights_and_activations_are_not_copied() -> None:
    """The forward returns what the backward needs: the weights it saves come back as the
    parameters themselves (autograd's version check then sees an in-place change between the
    two passes, as in eager), and activations it saves through a reshape are written into
    fresh arrays per call and returned as views of them, not copied out of planned buffers."""
    module = WithLoss(Block(), F.mse_loss)
    x = torch.randn(5, 3, 13, requires_grad=True)
    train_and_compare(module, [x, torch.randn(5, 3, 7)], reduced=13 + 33 + 7)
    forward = next(g for g in report.reports() if g.graph.endswith("forward"))
    runner = forward.executors[0].runner
    (plan,) = runner.run.compiled._plans.values()
    fn = runner.function
    passed = [i for i, v in enumerate(fn.outputs) if v in fn.args]
    assert passed and sorted(runner._passed) == passed
    assert all(not copied for i, (_, copied) in enumerate(plan.results) if i in passed)
    assert plan.fresh_views and all(not copied for s, copied in plan.results
                                    if s in plan.fresh_views)

    def step(run, change_weight: bool) -> None:
        out = run(x, torch.randn(5, 3, 7))
        if change_weight:
            with torch.no_grad():
                module.model.fc2.weight.add_(1.0)
        out.backward()

    for run in (module, torch.compile(module, backend="tilefold", options={"strict": True})):
        step(run, False)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            step(run, True)


LR = 1e-2


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=0.1),
    lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9),
])
def test_compiled_optimizer_step_matches_eager(make) -> None:
    """`torch.compile(optimizer.step)` lowers natively, strict (`lerp`'s `prims.fma`, the
    functional `copy`; the parameters and moments written back), and three steps match the
    eager optimizer's on the same gradients."""
    module = Block()
    twin = copy.deepcopy(module)
    ours, theirs = make(module.parameters()), make(twin.parameters())
    step = torch.compile(ours.step, backend="tilefold", options={"strict": True})
    x = torch.randn(6, 13)
    for _ in range(3):
        for m, opt in ((module, ours), (twin, theirs)):
            opt.zero_grad()
            m(x).square().mean().backward()
        step()
        theirs.step()
        for (name, p), q in zip(module.named_parameters(), twin.parameters(), strict=True):
            # Adam's m / sqrt(v) amplifies rounding where a gradient is near 0 (fma rounds
            # once, mul + add twice): the updates agree to 0.5% of the learning rate
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                       atol=5e-3 * LR, err_msg=name)
    graphs = report.reports()
    assert graphs and all(g.mode == "tilefold" and not g.fallback_nodes for g in graphs), \
        [g.format() for g in graphs]


def test_bf16_autocast_step_is_native_and_within_bf16_rounding() -> None:
    """Under `torch.autocast("cpu", bfloat16)` the linears run in bf16 (their inputs, weights
    and outputs rounded), GELU and LayerNorm on bf16 (as eager: the block returns bf16), the
    loss in f32; fp32 master weights get the gradients. Against float64 without any rounding,
    each bf16 rounding on a value's path adds at most 2 u(bf16) of its terms' size: the loss
    passes 7 (x, W1, h, GELU, W2, y, the norm), a gradient at most 10 (its backward's bf16
    results and operands too), so the bound is that many times the bf16 rule, in units of
    the largest gradient as the other tests do."""
    torch.manual_seed(3)
    net = Block(d_in=13, hidden=33, d_out=7)
    oracle = copy.deepcopy(net).double()
    compiled = torch.compile(net, backend="tilefold", options={"strict": True})
    x, target = torch.randn(4, 3, 13), torch.randn(4, 3, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        assert out.dtype == torch.bfloat16  # as eager's autocast returns it
        loss = F.mse_loss(out, target)
    loss.backward()
    want = F.mse_loss(oracle(x.double()), target.double())
    want.backward()
    rtol = tolerance("bf16", 33)["rtol"]
    assert abs(loss.item() - want.item()) <= 7 * rtol * (abs(want.item()) + 1)
    scale = max(float(p.grad.abs().max()) for p in oracle.parameters())
    for (name, got), ref in zip(net.named_parameters(), oracle.parameters(), strict=True):
        assert got.grad is not None and got.grad.dtype == torch.float32, name
        error = float((got.grad.double() - ref.grad).abs().max()) / scale
        assert error <= 10 * rtol * (float(ref.grad.abs().max()) / scale + 1), (name, error)
    _assert_training_native()
