"""Training through `torch.compile(backend="tilefold")`: a graph that needs autograd is split by
AOTAutograd into a forward and a backward graph, and tilefold lowers both.

AOTAutograd traces the joint forward+backward graph with `training_decompositions()` (PyTorch's
core ATen table, which takes every backward op, `gelu_backward`, `native_layer_norm_backward`,
`_softmax_backward_data`, `threshold_backward`, `embedding_dense_backward` (an accumulating
`index_put`), the losses' forward and backward (`nll_loss_backward`'s one-hot `scatter`), ...,
down to ops the rules lower; SDPA as CPU flash attention, its forward and backward decomposed
so that the forward saves one log-sum-exp per query row, not the probabilities, which the
backward recomputes: `training_attention.py`), then partitions it with
`min_cut_rematerialization_partition`, as Inductor does: the forward saves what the backward
needs, and cheap elementwise values (GELU's `erf`, a mask) are recomputed in the backward
instead of being stored, fewer tensors kept alive between the two passes.

Every input of both graphs is an IR argument: parameters are never frozen as constants (the
optimizer writes them every step), so a step after `optimizer.step()` calls the same compiled
graphs on the updated tensors, with no re-lowering. `lower` is the backend's lowering of one
ATen graph (the whole graph, or its supported partitions; in strict mode a node left to
PyTorch is a `FallbackError`): `dynamo._lower`, passed in so that this module does not import
the backend that calls it.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tilefold.errors import FallbackError, TilefoldError, strict
from tilefold.frontend import graph_cache, training_attention, training_cache
from tilefold.frontend.report import GraphReport, left_to_pytorch, record

log = logging.getLogger("tilefold.frontend")

# lower(aten_graph, inputs, frozen, report, strict, weights) -> a callable running the graph
Lower = Callable[[fx.GraphModule, list[Any], set[int], GraphReport, bool | None, str | None],
                 Callable[..., Any]]
# cached(entry, inputs, report, strict, weights) -> a callable running a stored lowering
Cached = Callable[[graph_cache.Entry, list[Any], GraphReport, bool | None, str | None],
                  Callable[..., Any]]


class TrainingUnsupported(TilefoldError):
    """A graph that needs autograd and that tilefold cannot compile for training."""


def training_decompositions() -> dict:
    """PyTorch's core ATen decompositions, whole: unlike inference, no op is kept whole for a
    rule, since autograd must see the forward in the pieces it differentiates (`linear` is
    `t` + `addmm` either way, and `layer_norm`, `softmax`, `gelu` arrive as their native ops,
    which rules lower), plus batch norm's training form (mean and variance over the batch, the
    running statistics updated as the graph's extra results), which that table keeps whole."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    table = torch.export.default_decompositions()
    table.update(get_decompositions([aten._native_batch_norm_legit_functional]))
    table[aten.var_mean.correction] = _var_mean
    table.update(training_attention.decompositions())
    return table


def _var_mean(x: torch.Tensor, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`var_mean` in two passes, the mean first, then the squares of the deviations from it
    (batch norm's statistics; PyTorch's own decomposition ends in prims no rule lowers)."""
    dims = [d % max(x.dim(), 1) for d in dim] if dim else list(range(x.dim()))  # []: all
    count = 1
    for d in dims:
        count *= x.shape[d]
    mean = torch.mean(x, dims, keepdim=True)
    squares = torch.sum((x - mean) * (x - mean), dims, keepdim=keepdim)
    var = squares / max(count - (1 if correction is None else correction), 0)
    return var, mean if keepdim else torch.squeeze(mean, dims)


def saved_tensors(out: torch.Tensor) -> list[torch.Tensor]:
    """The tensors autograd saved for `out`'s backward (each node's `_saved_*` fields and
    `saved_tensors`, over its whole graph): what a step keeps between its two passes
    (`benchmarks/train_rss.py`, `tests/frontend/test_training_attention.py`)."""
    found: list[torch.Tensor] = []
    stack, visited = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for name in dir(node):
            if name.startswith("_saved_") or name == "saved_tensors":
                try:
                    value = getattr(node, name)
                except RuntimeError:  # freed, or not a tensor
                    continue
                found += [t for t in (value if isinstance(value, tuple) else (value,))
                          if isinstance(t, torch.Tensor)]
        stack.extend(f for f, _ in node.next_functions)
    return found


def _after_pytorch(runner: Callable[..., Any]) -> Callable[..., Any]:
    """`runner`, first sending PyTorch's OpenMP workers to rest: the optimizer's step (before
    a forward) and autograd's own ops (before a backward) leave them spinning for
    milliseconds beside tilefold's threads."""
    from tilefold.frontend import openmp

    def run(*args: Any) -> Any:
        openmp.pause_workers()
        return runner(*args)

    return run


_POOL: weakref.ref | None = None
# the training pool's arena: virtual memory, resident where plans write (GPT-2's largest
# backward writes 388 MB)
TRAINING_POOL_BYTES = 1 << 30


def _training_pool() -> Any:
    """The intermediate buffers every live training graph shares (`compiler.SharedBuffers`):
    a step runs its graphs one at a time (each Dynamo graph's forward, then the backwards, the
    pieces of a graph break included), so they need what the largest plan needs, not the sum
    (GPT-2's transformer and loss graphs had 243 and 196 MB pools of their own). Held by the
    graphs alone: it goes with the last of them."""
    global _POOL
    from tilefold.compiler import SharedBuffers

    pool = _POOL() if _POOL is not None else None
    if pool is None:
        pool = SharedBuffers(TRAINING_POOL_BYTES)
        _POOL = weakref.ref(pool)
    return pool


def _consuming(report: GraphReport, runner: Callable[..., Any]) -> Callable[[list], Any]:
    """The backward's boxed call: AOTAutograd hands the saved tensors over in a list, which
    the whole graph's runner takes over (`GraphRunner.consume`), letting each go after its
    last use so that the gradients reuse its memory, as eager autograd frees a node's saved
    tensors once it ran (without it, all of a step's activations stayed alive beside all of
    its gradients at the backward's end: MiniLM's peak)."""
    from tilefold.compiler import handed_over

    executors = report.executors
    whole = report.mode == "tilefold" and report.partitions == 1 and len(executors) == 1
    consume = getattr(executors[0], "consume", None) if whole else None
    run = _after_pytorch(consume or functools.partial(handed_over, runner))
    run._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd's boxed convention
    return run


def training_backend(gm: fx.GraphModule, example_inputs: list[Any], graph: str,
                     flag: bool | None, weights: str | None, lower: Lower, cached: Cached
                     ) -> Callable[..., Any]:
    """The compiled callable for Dynamo graph `graph` when autograd is on: AOTAutograd with a
    forward and a backward compiler that each lower their graph to tilefold, or, warm, the
    stored lowerings of both (`training_cache`)."""
    if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in example_inputs):
        raise TrainingUnsupported(
            f"graph {graph}: training runs on CPU tensors only for now; the GPU path compiles "
            "inference (run it under torch.no_grad())")
    started = time.perf_counter()
    shared = _training_pool()
    key = training_cache.key(gm, example_inputs, weights)
    stored = training_cache.load(key) if key else None
    if stored is not None:
        try:
            return _from_cache(stored, gm, example_inputs, graph, flag, weights, cached, shared)
        except TilefoldError as exc:  # e.g. a stale entry the IR no longer parses
            if strict(flag):
                raise FallbackError(f"graph {graph}: the cached lowering failed: {exc}") from exc
            log.warning("tilefold: graph %s: the cached lowering failed (%s); tracing afresh",
                        graph, exc)
    facts: dict[str, Any] = {}  # the forward's, for the record the backward's compile stores
    parts: dict[str, tuple[Any, int, Any]] = {}

    def compiler(part: str) -> Callable[[fx.GraphModule, list[Any]], Callable]:
        def compile_part(aten_gm: fx.GraphModule, aten_inputs: list[Any]) -> Callable:
            from functorch.compile import make_boxed_func

            report = GraphReport(f"{graph} {part}", "tilefold")
            report.trace_s = time.perf_counter() - started
            try:
                # every input an argument: parameters change every optimizer step; constants
                # the graph holds (get_attr) are read as real tensors
                with unset_fake_temporarily():
                    runner = lower(aten_gm, list(aten_inputs), set(), report, flag, weights)
                for executor in report.executors:  # nothing of a step kept for the next
                    executor.runner.transient(shared)
                if key:
                    _keep(part, aten_gm, report, facts, parts, key)
            except FallbackError:
                raise
            except Exception as exc:  # whatever tilefold cannot do, PyTorch runs
                left_to_pytorch(report, f"graph {graph} ({part})", exc, flag)
                runner = aten_gm.forward
            record(report)
            if part == training_cache.BACKWARD:
                return _consuming(report, runner)
            return make_boxed_func(_after_pytorch(runner))

        return compile_part

    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    compiled = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=training_decompositions(),
    )
    return compiled(gm, example_inputs)


def _keep(part: str, aten_gm: fx.GraphModule, report: GraphReport, facts: dict[str, Any],
          parts: dict[str, tuple[Any, int, Any]], key: str) -> None:
    """Note a part that lowered whole; once the backward has, store both and the record."""
    whole = report.mode == "tilefold" and report.partitions == 1 and len(report.executors) == 1
    if not whole:
        return
    if part == training_cache.FORWARD:
        facts.update(training_cache.forward_facts(aten_gm) or {})
    elif part != training_cache.BACKWARD or not facts:
        return
    runner = report.executors[0].runner
    parts[part] = (runner.converted, report.aten_nodes, runner.optimized)
    if part == training_cache.BACKWARD:
        joint = training_cache.joint(facts, aten_gm)
        if joint is not None:
            training_cache.store(key, joint, parts)
        facts.clear()
        parts.clear()


def _from_cache(stored: tuple[training_cache.Joint, graph_cache.Entry, graph_cache.Entry],
                gm: fx.GraphModule, example_inputs: list[Any], graph: str, flag: bool | None,
                weights: str | None, cached: Cached, shared: Any) -> Callable[..., Any]:
    """The compiled callable from the stored forward and backward lowerings: AOTAutograd's
    autograd.Function made again (`training_cache.function`), no trace."""
    joint, forward, backward = stored
    attributes = graph_cache.lifted(gm)
    real = [*attributes, *example_inputs]
    runners = []
    for part, entry in ((training_cache.FORWARD, forward), (training_cache.BACKWARD, backward)):
        report = GraphReport(f"{graph} {part}", "tilefold")
        run = cached(entry, real, report, flag, weights)
        for executor in report.executors:
            executor.runner.transient(shared)
        runners.append(_after_pytorch(run) if part == training_cache.FORWARD
                       else _consuming(report, run))
    call = training_cache.function(joint, *runners)
    return (lambda *args: call(*attributes, *args)) if attributes else call
