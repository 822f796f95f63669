"""Training through `torch.compile(backend="tilefold")`: a graph that needs autograd is split by
AOTAutograd into a forward and a backward graph, and tilefold lowers both.

AOTAutograd traces the joint forward+backward graph with `training_decompositions()` (PyTorch's
core ATen table, which takes every backward op, `gelu_backward`, `native_layer_norm_backward`,
`_softmax_backward_data`, `threshold_backward`, `embedding_dense_backward` (an accumulating
`index_put`), the losses' forward and backward (`nll_loss_backward`'s one-hot `scatter`), ...,
down to ops the rules lower; SDPA is traced as its math form, matmuls and softmax, which
autograd differentiates), then partitions it with `min_cut_rematerialization_partition`, as
Inductor does: the forward saves what the backward needs, and cheap elementwise values (GELU's
`erf`, a mask) are recomputed in the backward instead of being stored, fewer tensors kept
alive between the two passes.

Every input of both graphs is an IR argument: parameters are never frozen as constants (the
optimizer writes them every step), so a step after `optimizer.step()` calls the same compiled
graphs on the updated tensors, with no re-lowering. `lower` is the backend's lowering of one
ATen graph (the whole graph, or its supported partitions; in strict mode a node left to
PyTorch is a `FallbackError`): `dynamo._lower`, passed in so that this module does not import
the backend that calls it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilefold.errors import FallbackError, TilefoldError
from tilefold.frontend.report import GraphReport, left_to_pytorch, record

# lower(aten_graph, inputs, frozen, report, strict, weights) -> a callable running the graph
Lower = Callable[[fx.GraphModule, list[Any], set[int], GraphReport, bool | None, str | None],
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


def _after_pytorch(runner: Callable[..., Any]) -> Callable[..., Any]:
    """`runner`, first sending PyTorch's OpenMP workers to rest: the optimizer's step (before
    a forward) and autograd's own ops (before a backward) leave them spinning for
    milliseconds beside tilefold's threads."""
    from tilefold.frontend import openmp

    def run(*args: Any) -> Any:
        openmp.pause_workers()
        return runner(*args)

    return run


def training_backend(gm: fx.GraphModule, example_inputs: list[Any], graph: str,
                     flag: bool | None, weights: str | None, lower: Lower) -> Callable[..., Any]:
    """The compiled callable for Dynamo graph `graph` when autograd is on: AOTAutograd with a
    forward and a backward compiler that each lower their graph to tilefold."""
    if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in example_inputs):
        raise TrainingUnsupported(
            f"graph {graph}: training runs on CPU tensors only for now; the GPU path compiles "
            "inference (run it under torch.no_grad())")
    started = time.perf_counter()
    from tilefold.compiler import SharedBuffers

    shared = SharedBuffers()  # the forward and backward never run at once: one set of buffers

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
            except FallbackError:
                raise
            except Exception as exc:  # whatever tilefold cannot do, PyTorch runs
                left_to_pytorch(report, f"graph {graph} ({part})", exc, flag)
                runner = aten_gm.forward
            record(report)
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
    with sdpa_kernel(SDPBackend.MATH):  # attention as matmuls and softmax, differentiated so
        return compiled(gm, example_inputs)
