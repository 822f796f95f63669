"""The `torch.compile(model, backend="tilefold")` backend: Dynamo graph -> ATen -> tilefold IR.

Dynamo's graph is traced to ATen by AOTAutograd for inference. Nodes without a lowering rule are
partitioned out and left to PyTorch; everything else is lowered into tilefold functions (one per
partition). Parameters become IR constants, frozen at compile time and re-lowered if PyTorch
reports that they were modified in place (inference tensors, which keep no version, stay
arguments). A graph that needs autograd goes to `frontend/training.py`: AOTAutograd's forward
and backward graphs, both lowered here with every input an argument. A graph that tilefold
cannot handle for any reason runs eagerly with a log line instead of failing the user's
program; in strict mode (the option `strict`, else `TILEFOLD_STRICT`) that, and a node left to
PyTorch, is a `FallbackError`.
CUDA tensors take the GPU path (`frontend/gpu_runner.py`: `tilefold.gpu` on the device).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from tilefold.errors import FallbackError, TilefoldError, strict
from tilefold.frontend import graph_cache, openmp
from tilefold.frontend.converter import (
    Input,
    convert_graph,
    describe_unsupported,
    is_mutation,
    is_size_node,
    op_name,
)
from tilefold.frontend.export import inference_decompositions
from tilefold.frontend.gpu_runner import runner_factory
from tilefold.frontend.preserved import preserve
from tilefold.frontend.report import GraphReport, left_to_pytorch, record
from tilefold.frontend.runner import GraphRunner
from tilefold.frontend.training import TrainingUnsupported, training_backend

log = logging.getLogger("tilefold.frontend")
NAME = "tilefold"


def register() -> None:
    """Register the backend by name unless torch.compile already knows it (e.g. via entry point)."""
    from torch._dynamo.backends import registry

    if NAME not in registry._COMPILER_FNS and registry._BACKENDS.get(NAME) is None:
        registry.register_backend(backend, name=NAME)


def backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict | None = None
            ) -> Callable[..., Any]:
    """torch.compile entry: returns a callable running `gm` through tilefold where it can.

    `options={"strict": True}` raises `FallbackError` instead of leaving any of the graph to
    PyTorch or to the reference interpreter; `False` allows that even under TILEFOLD_STRICT.
    `options={"weights": "int8"}` (or "int4") stores the model's linear weights quantized
    (weight-only, `tilefold.compile(weights=...)`; CPU), else TILEFOLD_WEIGHTS decides.
    """
    flag = (options or {}).get("strict")
    flag = None if flag is None else bool(flag)
    weights = (options or {}).get("weights")
    if weights is not None:
        from tilefold.compiler import pipeline

        pipeline(weights)  # a DTypeError now for a format tilefold does not have
    graph = f"#{len(_GRAPHS)}"
    _GRAPHS.append(graph)
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    ):
        try:  # training: AOTAutograd's forward and backward graphs, both lowered
            return training_backend(gm, example_inputs, graph, flag, weights, _lower,
                                    _cached)
        except TrainingUnsupported as exc:
            return _eager(gm, graph, str(exc), flag)
    preserve(gm)
    frozen = {i for i, t in enumerate(example_inputs)
              if isinstance(t, torch.nn.Parameter) and not t.is_inference()}
    report = GraphReport(graph, "tilefold")
    started = time.perf_counter()
    key = graph_cache.graph_key(gm, example_inputs, weights=weights)
    entry = graph_cache.load(key) if key else None
    if entry is not None:
        attributes = graph_cache.lifted(gm)
        try:
            run = _cached(entry, [*attributes, *example_inputs], report, flag, weights)
            return (lambda *args: run(*attributes, *args)) if attributes else run
        except TilefoldError as exc:  # e.g. a stale entry the IR no longer parses
            if strict(flag):
                raise FallbackError(f"graph {graph}: the cached lowering failed: {exc}") from exc
            log.warning("tilefold: graph %s: the cached lowering failed (%s); lowering afresh",
                        graph, exc)

    def inference(aten_gm: fx.GraphModule, aten_inputs: list[Any]) -> Callable:
        report.trace_s = time.perf_counter() - started
        real, real_frozen = _flattened(aten_gm, example_inputs, frozen)
        try:
            with unset_fake_temporarily():  # weights are read as real tensors
                runner = _lower(aten_gm, real, real_frozen, report, flag, weights)
            same_inputs = sum(n.op == "placeholder" for n in aten_gm.graph.nodes) == len(
                graph_cache.lifted(gm)) + len(example_inputs)
            if key and same_inputs and isinstance(runner, _Frozen) and graph_cache.storable():
                graph_cache.store(key, runner.runner.converted, report.aten_nodes,
                                  runner.runner.optimized)
            return runner
        except FallbackError:
            raise
        except Exception as exc:  # whatever tilefold cannot do, PyTorch runs
            left_to_pytorch(report, f"graph {graph}", exc, flag)
            return aten_gm.forward

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    compiler = aot_autograd(
        fw_compiler=lambda g, i: make_boxed_func(inference(g, i)),
        inference_compiler=lambda g, i: make_boxed_func(inference(g, i)),
        decompositions=inference_decompositions(),
        keep_inference_input_mutations=True,  # state writes stay in the graph (rules/state.py)
    )
    compiled = compiler(gm, example_inputs)
    record(report)
    return compiled


_GRAPHS: list[str] = []


def _flattened(gm: fx.GraphModule, inputs: list[Any], frozen: set[int]
               ) -> tuple[list[Any], set[int]]:
    """The graph's inputs as AOTAutograd passes them, and which are frozen: a tensor subclass
    (torchao's quantized weights) arrives as its inner tensors, each frozen with its parameter.
    The inputs as given where the flattening does not match the graph's placeholders."""
    if not any(is_traceable_wrapper_subclass(t) for t in inputs):
        return inputs, frozen
    flat: list[Any] = []
    flat_frozen: set[int] = set()
    for i, t in enumerate(inputs):
        for inner in _leaves(t):
            if i in frozen:
                flat_frozen.add(len(flat))
            flat.append(inner)
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if len(vals) != len(flat) or any(
            not isinstance(v, torch.Tensor) or not isinstance(t, torch.Tensor)
            or v.dtype != t.dtype or tuple(v.shape) != tuple(t.shape)
            for v, t in zip(vals, flat, strict=True)):
        return inputs, frozen
    return flat, flat_frozen


def _leaves(t: Any) -> list[Any]:
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [leaf for name in names for leaf in _leaves(getattr(t, name))]


def _cached(entry: graph_cache.Entry, real: list[Any], report: GraphReport,
            flag: bool | None, weights: str | None) -> Callable:
    """The graph's runner from its stored lowering, bound to `real`'s weights (Dynamo calls it
    with the graph's inputs, as AOTAutograd's wrapper would be)."""
    started = time.perf_counter()
    make = runner_factory(real, weights)  # CUDA tensors: the GPU path
    real = [t if i in entry.frozen else None for i, t in enumerate(real)]  # as `_lower`

    def build() -> GraphRunner:
        return make(graph_cache.converted(entry, real), f"graph {report.graph}", flag)

    runner = _Frozen(build, real, set(entry.frozen), build())
    report.cached, report.partitions = True, 1
    report.aten_nodes, report.lowered = entry.aten_nodes, dict(entry.lowered)
    report.add(runner)
    report.convert_s = time.perf_counter() - started
    record(report)
    return lambda *args: tuple(runner(*args))


def _eager(gm: fx.GraphModule, graph: str, reason: str, flag: bool | None) -> Callable:
    if strict(flag):
        raise FallbackError(f"graph {graph} would run in PyTorch: {reason}")
    log.warning("tilefold: graph %s runs in PyTorch: %s", graph, reason)
    record(GraphReport(graph, "eager", reason=reason))
    return gm.forward


class _Supported(OperatorSupportBase):
    """Nodes the trial lowering handled; size arithmetic stays with PyTorch (sizes are no IR
    values, and a partition may only hand tensors back), and so do writes back into the
    graph's inputs (a partition's inputs are not the graph's)."""

    def __init__(self, unsupported: set[fx.Node]):
        self.unsupported = unsupported

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        return (
            node.op == "call_function" and node not in self.unsupported
            and not is_size_node(node) and not is_mutation(node)
        )


def _lower(gm: fx.GraphModule, real: list[Any], frozen: set[int], report: GraphReport,
           flag: bool | None, weights: str | None):
    """Lower the ATen graph whole, or its supported partitions; return the callable to run."""
    started = time.perf_counter()
    label = f"graph {report.graph}"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(real):
        frozen = set()  # AOTAutograd reordered the inputs: keep every input an argument
    written = {placeholders.index(n.args[0]) for n in gm.graph.nodes if is_mutation(n)}
    frozen = frozen - written  # state the graph writes is an argument, never a constant
    index = {n.name: i for i, n in enumerate(placeholders)}  # names survive partitioning
    make = runner_factory(real, weights)  # CUDA tensors: the GPU path
    # Only the frozen weights are read again (a re-lowering's constants): the closures below
    # keep no other example input alive (an optimizer step's first gradients, 4 bytes a
    # parameter, had stayed for the whole run).
    real = [t if i in frozen else None for i, t in enumerate(real)]

    def top_inputs(i: int, node: fx.Node) -> Input:
        return _input_kind(node, i, real, frozen)

    trial = convert_graph(gm.graph, top_inputs, trial=True)
    report.aten_nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    report.lowered = dict(trial.lowered)
    report.symbolic_dims = sorted({str(d) for a in trial.module["main"].args for d in a.type.shape
                                   if not isinstance(d, int)})
    if not trial.unsupported:
        runner = _Frozen(lambda: make(convert_graph(gm.graph, top_inputs), label, flag),
                         real, frozen, make(trial, label, flag))
        report.partitions = 1
        report.add(runner)
        report.convert_s = time.perf_counter() - started
        return runner
    if strict(flag):
        raise FallbackError(f"{label} would leave nodes to PyTorch: "
                            f"{describe_unsupported(trial.unsupported)}")
    for node, why in trial.unsupported.items():
        report.fallback.setdefault(op_name(node), why)
        log.info("tilefold: PyTorch runs %s (%s): %s", op_name(node), node.name, why)
    report.fallback_nodes = len(trial.unsupported)
    report.mode = "partitioned"
    partitioner = CapabilityBasedPartitioner(
        gm, _Supported(set(trial.unsupported)), allows_single_node_partition=True
    )
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    partitions = []
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and node.target.startswith("fused_"):
            sub = fused.get_submodule(node.target)
            outer = list(node.args)

            def sub_inputs(i: int, ph: fx.Node, outer=outer) -> Input:
                parent = outer[i]
                if (isinstance(parent, fx.Node) and parent.op == "placeholder"
                        and parent.name in index):
                    return _input_kind(parent, index[parent.name], real, frozen)
                return _input_kind(ph, -1, real, set())

            single = not isinstance(next(iter(reversed(sub.graph.nodes))).args[0], tuple | list)
            part_label = f"{label} partition {node.target}"
            part = _Partition(lambda sub=sub, sub_inputs=sub_inputs, part_label=part_label:
                              make(convert_graph(sub.graph, sub_inputs), part_label, flag),
                              single)
            setattr(fused, node.target, part)
            partitions.append(part)
            report.partitions += 1
            report.add(part)
    fused.recompile()
    report.lowered = {k: v for k, v in report.lowered.items() if k not in report.fallback}
    report.convert_s = time.perf_counter() - started
    return _Partitioned(fused, partitions, real, frozen)


def _input_kind(node: fx.Node, i: int, real: list[Any], frozen: set[int]) -> Input:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return ("size", None)
    if i in frozen:
        return ("constant", real[i])
    return ("arg", node.name)


class _Reported:
    """What a graph report asks of a tilefold part, answered by its current `runner`."""

    runner: GraphRunner

    @property
    def executor(self) -> str:
        return self.runner.executor

    def groups(self) -> list[tuple[str, str]]:
        return self.runner.run.groups()

    def methods(self) -> dict[str, int]:
        return self.runner.run.methods()

    def decisions(self) -> list[Any]:
        return self.runner.run.decisions()


class _Partition(_Reported, torch.nn.Module):
    """A fused partition replaced by its tilefold runner (`build` lowers it again)."""

    def __init__(self, build: Callable[[], GraphRunner], single: bool):
        super().__init__()
        self.build, self.single = build, single
        self.runner = build()

    def forward(self, *args: Any) -> Any:
        openmp.pause_workers()  # PyTorch ran the ops before this partition
        outs = self.runner(*args)
        return outs[0] if self.single else tuple(outs)


def _watch(real: list[Any], frozen: set[int]) -> list[tuple[int, Any, int]]:
    """(index, tensor, version) of each frozen weight, to see in-place updates and swaps."""
    return [(i, real[i], real[i]._version) for i in sorted(frozen)]


def _changed(watch: list[tuple[int, Any, int]], args: tuple) -> bool:
    return any(args[i] is not t or t._version != v for i, t, v in watch)


class _Frozen(_Reported):
    """A whole-graph runner whose constants are re-lowered when a frozen weight changes."""

    def __init__(self, build: Callable[[], GraphRunner], real: list[Any], frozen: set[int],
                 runner: GraphRunner):
        self.build = build
        self.watch = _watch(real, frozen)
        self.runner = runner

    def __call__(self, *args: Any) -> list[Any]:
        if _changed(self.watch, args):
            log.info("tilefold: a frozen weight changed; lowering the graph again")
            self.watch = _watch(list(args), {i for i, _, _ in self.watch})
            self.runner = self.build()
        outs = self.runner(*args)
        if _CAPTURED is not None:
            _CAPTURED.append(Call(self, args, outs))
        return outs

    def consume(self, args: list) -> list[Any]:
        """`self(*args)`, emptying `args` (`GraphRunner.consume`: a training backward's
        saved tensors let go as it goes); a plain call where weights are watched or calls
        captured."""
        if self.watch or _CAPTURED is not None:
            from tilefold.compiler import handed_over

            return handed_over(self, args)
        return self.runner.consume(args)


@dataclass(frozen=True)
class Call:
    """A whole-graph runner's call as `capture()` saw it: calling `runner(*args)` again runs the
    same graph on the same tensors, without Dynamo's guards or AOTAutograd's wrappers."""

    runner: Callable[..., list[Any]]
    args: tuple
    outputs: list[Any]


_CAPTURED: list[Call] | None = None


@contextmanager
def capture() -> Iterator[list[Call]]:
    """Record the whole-graph tilefold runners called inside the block, with their arguments
    and results (a caller that owns every input, such as `Generator`, may then call a graph
    directly)."""
    global _CAPTURED
    saved, _CAPTURED = _CAPTURED, []
    try:
        yield _CAPTURED
    finally:
        _CAPTURED = saved


class _Partitioned:
    """A partitioned graph (PyTorch runs what tilefold cannot) whose partitions are re-lowered
    when a frozen weight changes, as `_Frozen` does for a whole graph."""

    def __init__(self, fused: fx.GraphModule, partitions: list[_Partition], real: list[Any],
                 frozen: set[int]):
        self.fused, self.partitions = fused, partitions
        self.watch = _watch(real, frozen)

    def __call__(self, *args: Any) -> Any:
        if _changed(self.watch, args):
            log.info("tilefold: a frozen weight changed; lowering the partitions again")
            self.watch = _watch(list(args), {i for i, _, _ in self.watch})
            for part in self.partitions:
                part.runner = part.build()
        return self.fused.forward(*args)
