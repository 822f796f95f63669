"""The training step `parallelize(..., training=True)` plans: a model's loss and the gradient
of every parameter, traced as one joint forward+backward function (`make_fx` of
`torch.func.grad_and_value`, mutations functionalized) and lowered to IR whose arguments are
the parameters, buffers and inputs, named as the model names them.

    @main(%fc1_weight, %fc1_bias, ..., %x) -> (loss f32[], d fc1.weight, d fc1.bias, ...)

A weight that the trace transposes before a matmul (`linear` decomposes to `t` + `addmm`)
feeds the matmul directly with `transpose_b` flipped, as the inference export gives it, so
the templates see nn.Linear's weights as their matmuls' operands.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilefold.errors import TilefoldError, UnsupportedError
from tilefold.frontend.converter import convert_graph
from tilefold.ir import Module
from tilefold.ir.core import Function
from tilefold.passes import run_pipeline

Loss = Callable[[Any], torch.Tensor]


class TrainingError(TilefoldError):
    """A model whose training step cannot be traced as one joint graph."""


def joint_graph(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                loss: Loss | None) -> tuple[torch.fx.GraphModule, list[str], list[str]]:
    """The traced step `(parameters, buffers, inputs) -> (loss, gradients...)`, the names of
    its arguments (model names, then the inputs') and of the parameters it differentiates."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_parameters() if not b.requires_grad}
    buffers |= {n: b.detach() for n, b in model.named_buffers()}  # frozen: not differentiated
    names, count = list(params), len(params)
    if not names:
        raise TrainingError(f"parallelize(training=True): {type(model).__name__} has no "
                            "parameter that requires grad; there is nothing to train")

    def step(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = dict(zip(buffers, flat[count:count + len(buffers)], strict=True))
        inputs = flat[count + len(buffers):]

        def value(ps: dict[str, torch.Tensor]) -> torch.Tensor:
            out = torch.func.functional_call(model, {**ps, **state}, inputs)
            got = loss(out) if loss is not None else out
            if not isinstance(got, torch.Tensor) or got.dim() != 0:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got)
                raise TrainingError(
                    f"parallelize(training=True): the loss must be one scalar tensor, but "
                    f"{'loss(output)' if loss else type(model).__name__ + ' output'} is "
                    f"{shape}; pass loss=fn mapping the model's output to a scalar")
            return got

        grads, total = torch.func.grad_and_value(value)(dict(zip(names, flat[:count],
                                                                 strict=True)))
        return (total, *(grads[n] for n in names))

    flat = [*params.values(), *buffers.values(), *example_inputs]
    traced = torch.func.functionalize(step, remove="mutations")
    try:
        with sdpa_kernel(SDPBackend.MATH):  # attention as matmuls and softmax, differentiable
            try:
                gm = make_fx(traced, decomposition_table=decompositions())(*flat)
            except TrainingError:
                raise
            except Exception:  # data-dependent Python (transformers' mask checks): trace
                # the forward as torch.export sees it, which such code keeps to tensor ops
                model = exported(model, example_inputs)
                gm = make_fx(traced, decomposition_table=decompositions())(*flat)
    except TrainingError:
        raise
    except Exception as exc:  # tracing raises many kinds; the user needs the message
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UnsupportedError(
            f"parallelize(training=True): cannot trace {type(model).__name__}'s training step "
            f"with inputs {[tuple(x.shape) for x in example_inputs]}: {first}. Make its "
            "forward traceable (no data-dependent control flow, tensors in and out)") from exc
    return gm, [*names, *buffers, *input_names(model, len(example_inputs))], names


def decompositions() -> dict:
    """The joint graph's decompositions: the single-process training path's
    (`frontend.training.training_decompositions`), so both lower the same backward ops
    with the same rules (`frontend/rules`)."""
    from tilefold.frontend.training import training_decompositions

    return training_decompositions()


def exported(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]
             ) -> torch.nn.Module:
    """`model`'s forward as torch.export traces it, a module whose parameters and buffers
    keep the model's names: code that reads tensors' values in Python only where it is not
    exported (transformers skips an all-ones attention mask by `mask.all()`) traces."""
    with sdpa_kernel(SDPBackend.MATH):
        return torch.export.export(model, tuple(example_inputs)).module()


def input_names(model: torch.nn.Module, count: int) -> list[str]:
    """The forward's parameter names for its first `count` inputs (`input0`... otherwise)."""
    try:
        found = [p.name for p in inspect.signature(model.forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        found = []
    return found[:count] if len(found) >= count else [f"input{i}" for i in range(count)]


def weights_into_matmuls(fn: Function) -> None:
    """matmul(a, transpose(w)) -> matmul(a, w) {transpose_b flipped}, for a 2-D argument w."""
    args = set(fn.args)
    for op in fn.ops:
        if op.name != "matmul" or len(op.operands) != 2:
            continue
        t = op.operands[1].defining_op
        if (t is not None and t.name == "transpose" and t.operands[0] in args
                and t.operands[0].type.rank == 2 and tuple(t.attr("perm")) == (1, 0)):
            op.operands = [op.operands[0], t.operands[0]]
            op.attrs["transpose_b"] = not op.attr("transpose_b")


def scalars_unbroadcast(fn: Function) -> None:
    """add(broadcast_to(s), x) -> add(s, x) for a 0-d s, where x has the result's shape (the
    loss's seed gradient: a broadcast constant has no placement, so keeping it would gather x
    where the scalar broadcasts by itself)."""
    for op in fn.ops:
        if not op.has_trait("elementwise") or not op.results:
            continue
        operands = []
        for v in op.operands:
            b = v.defining_op
            scalar = b is not None and b.name == "broadcast_to" and b.operands[0].type.rank == 0
            operands.append(b.operands[0] if scalar else v)
        shape = op.results[0].type.shape
        if any(v.type.shape == shape for v in operands):  # the shape stays without them
            op.operands = operands


def training_module(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                    loss: Loss | None
                    ) -> tuple[Module, dict[str, str], dict[str, torch.Tensor], list[str]]:
    """The joint step as IR; the IR argument of each name; the parameters' and buffers'
    tensors; the parameters whose gradients follow the loss among the results."""
    gm, names, trained = joint_graph(model, example_inputs, loss)
    module = convert_graph(gm.graph, lambda i, node: ("arg", names[i].replace(".", "_")),
                           name="main", dim_names={}).module
    weights_into_matmuls(module["main"])
    scalars_unbroadcast(module["main"])
    run_pipeline(module, "canonicalize,cse,dce")
    args = {name: arg.name for name, arg in zip(names, module["main"].args, strict=True)}
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    tensors = {n: state[n].detach() for n in names if n in state}
    return module, args, tensors, trained
