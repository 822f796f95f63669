"""`torch.compile(optimizer.step)`: the update of every parameter runs as a few multi-tensor
kernels (horizontal fusion), written in place, and matches the eager optimizer step by step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tilefold.frontend import report

LR = 1e-2
OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=LR),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9),
    "sgd-nesterov-decay": lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9, nesterov=True,
                                                     weight_decay=0.1),
    "adam": lambda ps: torch.optim.Adam(ps, lr=LR),
    "adam-decay": lambda ps: torch.optim.Adam(ps, lr=LR, weight_decay=0.1),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=0.0),
    "adamw-decay": lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=0.1),
    "adamw-amsgrad": lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=0.1, amsgrad=True),
    # two groups: their own learning rates and decay (constants per member of one kernel)
    "adamw-groups": lambda ps: torch.optim.AdamW(
        [{"params": ps[::2]}, {"params": ps[1::2], "lr": 3 * LR, "weight_decay": 0.0}],
        lr=LR, weight_decay=0.1),
}
# odd sizes: one element, primes, 0-d, a long one split over threads
SHAPES = [(1,), (7,), (13, 3), (), (5, 11), (40_009,)]


@pytest.fixture(autouse=True)
def _reports():
    torch._dynamo.reset()  # each test compiles its step anew (and reports it)
    report.REPORTS.clear()
    yield
    report.REPORTS.clear()


def _params(shapes, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _run(make, ours, theirs, steps: int = 4):
    """`steps` compiled steps checked against eager's; the compiled step (the report holds its
    graphs' runners weakly: keep it while reading them)."""
    opt, eager = make(ours), make(theirs)
    step = torch.compile(opt.step, backend="tilefold", options={"strict": True})
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p, q in zip(ours, theirs, strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        step()
        eager.step()
        for i, (p, q) in enumerate(zip(ours, theirs, strict=True)):
            # Adam's m / sqrt(v) amplifies rounding where a moment is near 0 (torch's lerp
            # rounds once, a multiply and an add twice): within 0.5% of the learning rate
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                       atol=5e-3 * LR, err_msg=f"parameter {i}")
    return step


def _plan():
    """The plan of the compiled step's last graph, every graph checked native."""
    graphs = report.reports()
    assert graphs and all(g.mode == "tilefold" and not g.fallback_nodes for g in graphs), \
        [g.format() for g in graphs]
    # the last graph is the steady step's (SGD's first step makes its momentum buffers)
    (executor,) = graphs[-1].executors
    (plan,) = executor.runner.run.compiled._plans.values()
    return plan


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_matches_eager(name: str) -> None:
    """Four steps of each optimizer over odd sizes (a 0-d parameter among them) match eager's,
    strict, every op native."""
    step = _run(OPTIMIZERS[name], _params(SHAPES), _params(SHAPES))
    assert _plan() is not None and step is not None


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_few_kernels_in_place(name: str) -> None:
    """Over tensors of rank 1 and more, the whole update is at most three native kernels
    (the step counters', the tensors'), a multi-tensor kernel among them, writing every
    parameter and moment in place: no copy step, no result copied back."""
    shapes = [s for s in SHAPES if s]
    step = _run(OPTIMIZERS[name], _params(shapes), _params(shapes), steps=2)
    plan = _plan()
    del step
    assert 1 <= len(plan.decisions) <= 3, plan.labels
    assert any(label.startswith("multitensor:") for label in plan.labels), plan.labels
    assert not any(label.startswith("copy") for label in plan.labels), plan.labels
    assert not any(copied for _, copied in plan.results), plan.results


def test_written_in_place() -> None:
    """The compiled step writes the parameters' and moments' own memory."""
    ps = _params([(7,), (13, 3)])
    opt = torch.optim.Adam(ps, lr=LR)
    step = torch.compile(opt.step, backend="tilefold", options={"strict": True})
    for p in ps:
        p.grad = torch.ones_like(p)
    step()
    state = [(p.data_ptr(), opt.state[p]["exp_avg"].data_ptr(),
              opt.state[p]["exp_avg_sq"].data_ptr()) for p in ps]
    before = [p.detach().clone() for p in ps]
    step()
    step()
    assert state == [(p.data_ptr(), opt.state[p]["exp_avg"].data_ptr(),
                      opt.state[p]["exp_avg_sq"].data_ptr()) for p in ps]
    assert all(not torch.equal(p, b) for p, b in zip(ps, before, strict=True))
    plan = _plan()
    layouts = {k: v for k, v in plan.layout.items() if v == "in place"}
    assert len(layouts) >= 3 * len(ps), plan.layout


def test_last_steps_gradients_are_not_kept() -> None:
    """Gradients are new tensors every step: neither the runner's inputs nor the plan's check
    for repeated inputs hold the last step's once the step returns, so a training step's
    peak does not hold two steps' gradients."""
    import gc

    ps = _params([(64, 64), (4096,)])
    opt = torch.optim.AdamW(ps, lr=LR)
    step = torch.compile(opt.step, backend="tilefold", options={"strict": True})
    for _ in range(5):
        for p in ps:
            p.grad = torch.randn(p.shape)
        step()
    gc.collect()
    grads = {p.grad.data_ptr() for p in ps}
    (executor,) = report.reports()[-1].executors
    held = [stable.array for stable in executor.runner._inputs]
    held += [last() for last in _plan().last_inputs]
    held = [a for a in held if a is not None and a.__array_interface__["data"][0] in grads]
    assert not held, f"{len(held)} array(s) of the last step's gradients held"
    params = {p.data_ptr() for p in ps}  # the parameters stay held: the step replays on them
    assert any(stable.array is not None and stable.array.__array_interface__["data"][0]
               in params for stable in executor.runner._inputs)


def test_dropped_gradients_are_freed_at_once() -> None:
    """Every step, the first included: once the caller drops its gradients (`zero_grad`
    sets them to None), nothing of tilefold keeps them alive, so the next backward does not
    allocate its gradients beside them. The parameters' arrays stay (the step replays)."""
    import gc
    import weakref

    ps = _params([(64, 64), (4096,)])
    opt = torch.optim.AdamW(ps, lr=LR)
    step = torch.compile(opt.step, backend="tilefold", options={"strict": True})
    rng = np.random.default_rng(0)
    for i in range(4):
        grads = []  # each gradient's memory: a NumPy array, alive while any view of it is
        for p in ps:
            memory = rng.standard_normal(p.shape).astype(np.float32)
            p.grad = torch.from_numpy(memory)
            grads.append(weakref.ref(memory))
        del memory
        step()
        opt.zero_grad(set_to_none=True)
        gc.collect()
        alive = [g for g in grads if g() is not None]
        assert not alive, f"step {i}: {len(alive)} dropped gradient(s) still alive"
    (executor,) = report.reports()[-1].executors
    params = {p.data_ptr() for p in ps}
    assert sum(stable.array is not None and stable.array.__array_interface__["data"][0]
               in params for stable in executor.runner._inputs) == len(ps)


def test_in_place_step_bumps_versions() -> None:
    """A parameter the compiled step writes in place counts as modified, as eager's `add_`:
    autograd then refuses a backward that saved its old value."""
    w = torch.nn.Parameter(torch.randn(5, 3))
    opt = torch.optim.SGD([w], lr=LR, momentum=0.9)
    step = torch.compile(opt.step, backend="tilefold", options={"strict": True})
    for _ in range(3):
        w.grad = torch.randn(5, 3)
        step()
    before = w._version
    loss = (w * w).sum()  # saves w
    w.grad = torch.randn(5, 3)
    step()
    assert w._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_training_loop_with_compiled_step() -> None:
    """Forward, backward and the AdamW step all compiled (as `bench train` runs them) follow
    eager's losses step by step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 32), torch.nn.GELU(),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 3))
    twin = copy.deepcopy(model)
    x, y = torch.randn(16, 13), torch.randint(0, 3, (16,))
    run = torch.compile(model, backend="tilefold", options={"strict": True})
    ours = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    theirs = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=0.1)
    step = torch.compile(ours.step, backend="tilefold", options={"strict": True})
    for _ in range(5):
        losses = []
        for m, opt, update in ((run, ours, step), (twin, theirs, theirs.step)):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            update()
            losses.append(float(loss))
        assert abs(losses[0] - losses[1]) <= 1e-4 * max(1.0, abs(losses[1])), losses
