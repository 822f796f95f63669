"""`parallelize`: an nn.Module's inference forward, or its training step, as a per-rank
program on a device mesh, run in each process of a torch.distributed job; placements from a
registered strategy (dp, megatron, megatron-sp, ilp, propagate) or given per name.

    model = parallelize(block, {"dp": 2, "tp": 2}, (x,), "megatron")
    y = model(x)        # in every process: the whole output, as one process computes it
    model = parallelize(mlp, {"tp": 2}, (x,), {"fc1.weight": "[S(0)]", "fc1.bias": "[S(0)]",
                        "fc2.weight": "[S(1)]"})      # the propagate strategy's annotations
    step = parallelize(mlp, {"dp": 2}, (x,), "dp", training=True, loss=fn)
    loss, grads = step(x)                             # grads: {"fc1.weight": ..., ...}

The module is exported (`torch.export`, the inference decompositions; for training the joint
graph of `distributed/training.py`) with its parameters as function arguments, planned by the
strategy on that IR (the inputs are its data arguments), the plan applied (placed,
propagated, its intermediates redistributed), its outputs made replicated, expanded and
partitioned (`spmd-partition`). Every process passes the same global inputs and keeps its own
block of each; the parameters' blocks are cut once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.export.graph_signature import InputKind

from tilefold.distributed.cost import AlphaBeta, CostModel
from tilefold.distributed.plan import Plan
from tilefold.distributed.strategies import STRATEGIES, Constraints, StrategyError, get_strategy
from tilefold.distributed.torchrun import RankProgram
from tilefold.distributed.training import Loss, training_module
from tilefold.errors import TilefoldError, UnsupportedError
from tilefold.frontend.converter import convert_graph
from tilefold.frontend.export import inference_decompositions
from tilefold.ir import Module, parse_module, print_module, verify
from tilefold.ir.placements import scatter
from tilefold.ir.types import (
    Mesh,
    Replicate,
    TensorType,
    format_placements,
    parse_placements,
)
from tilefold.passes import run_pipeline
from tilefold.passes.rewrite import Rewriter


def as_mesh(mesh: Mesh | Mapping[str, int]) -> Mesh:
    """A `Mesh`, or `{"dp": 2, "tp": 4}` as the mesh @m with those axes."""
    return mesh if isinstance(mesh, Mesh) else Mesh.of("m", **dict(mesh))


def export_with_parameters(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]
                           ) -> tuple[Module, dict[str, str], dict[str, torch.Tensor]]:
    """The forward as IR whose arguments are the parameters and buffers (named as the model
    names them, `fc1.weight`) and then the inputs; the IR argument of each name; the tensors."""
    try:
        ep = torch.export.export(model, tuple(example_inputs))
    except Exception as exc:  # torch.export raises many kinds; the user needs its message
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedError(f"parallelize: torch.export cannot take {type(model).__name__} "
                               f"with inputs {[tuple(x.shape) for x in example_inputs]}: "
                               f"{first}. Make its forward exportable (no data-dependent "
                               "control flow, tensors in and out)") from exc
    ep = ep.run_decompositions(inference_decompositions())
    specs = ep.graph_signature.input_specs
    names, tensors = [], {}
    for spec in specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            names.append(spec.target)
            tensors[spec.target] = ep.state_dict[spec.target]
        elif spec.kind == InputKind.USER_INPUT:
            names.append(spec.arg.name)
        else:
            raise TilefoldError(f"parallelize: input {spec.arg.name} is a {spec.kind.name}; "
                                "only parameters, buffers and tensor inputs are supported")

    def inputs(i: int, node: Any) -> tuple[str, Any]:
        return ("arg", names[i].replace(".", "_"))

    module = convert_graph(ep.graph, inputs, name="main", dim_names={}).module
    args = {name: arg.name for name, arg in zip(names, module["main"].args, strict=True)}
    return module, args, tensors


def strategy_plan(module: Module, mesh: Mesh, strategy: str | Mapping[str, str],
                  names: Mapping[str, str], inputs: Sequence[str], cost: CostModel | None,
                  constraints: Constraints, annotations: Mapping[str, str] | None) -> Plan:
    """The plan of `strategy`: a name in the strategy registry (searched on the exported IR,
    the inputs as its data arguments), or a mapping of parameter and input names to
    placements (`{"fc1.weight": "[S(0)]"}`), the "propagate" strategy's annotations."""
    if not isinstance(strategy, str):
        strategy, annotations = "propagate", strategy
    if strategy not in STRATEGIES:
        raise StrategyError(f"parallelize: strategy {strategy!r} is not one of "
                            f"{', '.join(sorted(STRATEGIES))}, or a mapping of parameter and "
                            "input names to placements")
    if annotations is not None and strategy != "propagate":
        raise StrategyError(f"parallelize: annotations are the 'propagate' strategy's; "
                            f"strategy {strategy!r} chooses its own placements")
    found = get_strategy(strategy)
    axis = getattr(found, "axis_name", None)
    if axis is not None and axis not in mesh.names and len(mesh.axes) > 1:
        raise StrategyError(f"parallelize: strategy {strategy!r} needs a mesh axis named "
                            f"{axis} (or a mesh of one axis); {mesh.declaration()} has "
                            f"neither: name the axis it should split the weights on {axis}")
    if strategy == "propagate":
        module = annotate(module, mesh, names, annotations or {})
    data = tuple(names[n] for n in inputs)
    return found.search(module, mesh, cost or AlphaBeta(mesh), replace(constraints, data=data))


def annotate(module: Module, mesh: Mesh, names: Mapping[str, str],
             annotations: Mapping[str, str]) -> Module:
    """A copy of `module` whose arguments carry the annotated placements (the rest R)."""
    entries = []
    for name, text in annotations.items():
        if name not in names:
            raise StrategyError(f"parallelize: the model has no parameter or input {name!r} "
                                f"(it has: {', '.join(names)})")
        placements = parse_placements(text)
        if len(placements) != len(mesh.axes):
            raise StrategyError(f"parallelize: {name} {text} gives {len(placements)} "
                                f"placements for the {len(mesh.axes)} axes of "
                                f"{mesh.declaration()}")
        entries.append((names[name], placements))
    return Plan(mesh, tuple(entries), "propagate").place(module)


def replicate_outputs(module: Module) -> None:
    """Redistribute every output to R on every axis (each process returns the whole)."""
    fn = module["main"]
    rewriter = Rewriter(fn)
    ret = fn.return_op
    outs = []
    for v in ret.operands:
        sharding = v.type.sharding
        if sharding is None or all(p == Replicate() for p in sharding.placements):
            outs.append(v)
            continue
        target = format_placements((Replicate(),) * len(sharding.placements))
        outs.append(rewriter.create(ret, "redistribute", [v], {"placements": target}).result)
    ret.operands = outs
    fn.result_types = [v.type for v in outs]


class ParallelModel:
    """A model's forward (or training step) partitioned over a mesh: `plan`, `placed` (global
    types), `per_rank` (the program each process runs), `gradients` (for a training step, the
    parameters in the order of their gradients); calling it runs this process's rank
    (torch.distributed initialized, world = mesh)."""

    def __init__(self, placed: Module, per_rank: Module, args: Mapping[str, str],
                 parameters: Mapping[str, np.ndarray], plan: Plan,
                 gradients: Sequence[str] | None = None):
        self.placed, self.per_rank, self.plan = placed, per_rank, plan
        self.gradients = None if gradients is None else list(gradients)
        fn = placed["main"]
        by_arg = {arg: name for name, arg in args.items()}
        self._types = {v.name: v.type for v in fn.args}
        self._order = [by_arg[v.name] for v in fn.args]
        self._inputs = [n for n in self._order if n not in parameters]
        self._parameters = dict(parameters)
        self._args = dict(args)
        self._program: RankProgram | None = None
        self._blocks: dict[int, dict[str, np.ndarray]] = {}

    def __reduce__(self) -> tuple:
        """Pickled as text (op classes made by factories do not pickle): a model parallelized
        once can be handed to spawned processes."""
        return (_from_text, (print_module(self.placed), print_module(self.per_rank), self._args,
                             self._parameters, self.plan.text, self.gradients))

    def block(self, name: str, value: np.ndarray, rank: int) -> np.ndarray:
        """Rank `rank`'s block of the global value of parameter or input `name`."""
        t: TensorType = self._types[self._args[name]]
        return scatter(np.ascontiguousarray(value), t)[rank] if t.sharding else value

    def arguments(self, rank: int, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The per-rank program's arguments on rank `rank` for these global inputs."""
        if len(inputs) != len(self._inputs):
            raise TilefoldError(f"the parallelized model takes {len(self._inputs)} inputs "
                                f"({', '.join(self._inputs)}), got {len(inputs)}")
        if rank not in self._blocks:  # the parameters' blocks, cut once per rank
            self._blocks[rank] = {n: self.block(n, a, rank) for n, a in self._parameters.items()}
        given = {n: self.block(n, np.asarray(x), rank)
                 for n, x in zip(self._inputs, inputs, strict=True)}
        return [self._blocks[rank].get(n, given.get(n)) for n in self._order]

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self._program is None:
            self._program = RankProgram(self.per_rank)
        arrays = [x.detach().cpu().numpy() for x in inputs]
        outs = self._program(*self.arguments(self._program.rank, arrays))
        results = [torch.from_numpy(o) for o in outs]
        if self.gradients is not None:  # a training step: the loss, each parameter's gradient
            return results[0], dict(zip(self.gradients, results[1:], strict=True))
        return results[0] if len(results) == 1 else tuple(results)


def _from_text(placed: str, per_rank: str, args: Mapping[str, str],
               parameters: Mapping[str, np.ndarray], plan: str,
               gradients: Sequence[str] | None) -> ParallelModel:
    return ParallelModel(verify(parse_module(placed)), verify(parse_module(per_rank)), args,
                         parameters, Plan.parse(plan), gradients)


def parallelize(model: torch.nn.Module, mesh: Mesh | Mapping[str, int],
                example_inputs: Sequence[torch.Tensor],
                strategy: str | Mapping[str, str] = "dp", *,
                annotations: Mapping[str, str] | None = None, cost: CostModel | None = None,
                memory_limit: int | None = None, training: bool = False,
                loss: Loss | None = None, pad: bool = False) -> ParallelModel:
    """`model`'s inference forward on `mesh` (see the module docstring), or with `training`
    its training step: `loss(output)` (default: the output, a scalar) and the gradient of
    every parameter, returned whole on every rank (partial sums all_reduced).

    strategy:     a name in the strategy registry (`tilefold.distributed.STRATEGIES`) or a
                  mapping of parameter and input names to placements;
    annotations:  the "propagate" strategy's placements, by name;
    cost, memory_limit: what the searched strategies judge a plan by (default:
                  `AlphaBeta(mesh)`, no limit);
    pad:          let the strategies split a dim that does not divide by its axis, as a
                  padded shard S(d,pad) (Megatron on an FFN width not divisible by tp).
    """
    mesh = as_mesh(mesh)
    gradients = None
    if training:
        module, args, parameters, gradients = training_module(model, example_inputs, loss)
    elif loss is not None:
        raise StrategyError("parallelize: a loss is for the training step (training=True)")
    else:
        module, args, parameters = export_with_parameters(model, example_inputs)
    inputs = [n for n in args if n not in parameters]
    plan = strategy_plan(module, mesh, strategy, args, inputs, cost,
                         Constraints(memory_limit=memory_limit, training=training, pad=pad),
                         annotations)
    placed, per_rank = partition(module, plan)
    weights = {n: t.detach().cpu().numpy() for n, t in parameters.items()}
    return ParallelModel(placed, per_rank, args, weights, plan, gradients)


def partition(module: Module, plan: Plan) -> tuple[Module, Module]:
    """The placed module of `plan` with every output replicated, and its per-rank program:
    partial sums combined before they are reduced, small all_reduces bucketed (a training
    step's gradients, as DDP does)."""
    placed = plan.apply(module)
    replicate_outputs(placed)
    run_pipeline(placed, "expand-redistribute,merge-partials")
    verify(placed)
    per_rank = parse_module(print_module(placed))
    run_pipeline(per_rank, "spmd-partition,bucket-all-reduces")
    return placed, verify(per_rank)
