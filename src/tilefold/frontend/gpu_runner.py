"""torch.compile graphs whose tensors are on a CUDA device: the lowered graph compiled for the
detected GPU (`tilefold.compile(module, target=...)`, `tilefold.gpu`) and called on the tensors
where they are, with no host copies, and replayed as a CUDA graph when its shapes are static.

`runner_factory(example_inputs)` is the dispatch: CUDA tensors get `GPUGraphRunner` for
`detect_gpu()`'s target (a GPU tilefold's table lacks is an `UnsupportedError`, so the graph
runs in PyTorch with a log line, or fails in strict mode); anything else keeps the CPU path
(`GraphRunner`, NumPy arrays). CUDA graphs (`TILEFOLD_CUDA_GRAPHS=0` turns them off) are
captured after one warm-up call, which compiles every kernel and copies the constants to the
device; never under Triton's interpreter, for symbolic shapes, or when a step of the graph runs
on the host; a call with other layouts than the captured ones runs the graph directly. A
capture that fails runs the graph uncaptured with a warning, or raises `FallbackError` in
strict mode.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from tilefold.codegen.triton.launch import interpreting
from tilefold.errors import FallbackError, UnsupportedError, strict
from tilefold.frontend.converter import Converted
from tilefold.frontend.runner import GraphRunner
from tilefold.target.gpu import GPUTarget, detect_gpu, gpu_target_names

log = logging.getLogger("tilefold.frontend")


def _on_gpu(t: Any) -> bool:
    return getattr(getattr(t, "device", None), "type", None) == "cuda"


def gpu_target_for(inputs: Sequence[Any]) -> GPUTarget | None:
    """The GPU target for a graph whose example inputs include CUDA tensors, else None."""
    if not any(_on_gpu(t) for t in inputs):
        return None
    target = detect_gpu()
    if target is None:
        raise UnsupportedError("torch.compile(backend='tilefold') on CUDA tensors: this GPU is "
                               f"not in tilefold's GPU table ({', '.join(gpu_target_names())});"
                               " add it to target/gpu.py, or move the model to the CPU")
    return target


def runner_factory(inputs: Sequence[Any], weights: str | None = None) -> Callable[..., Any]:
    """What runs a lowered graph for these example inputs: `factory(converted, label,
    strict)` is a `GPUGraphRunner` on CUDA tensors, else a `GraphRunner` (its constant
    weights stored as `weights`: `tilefold.compile`)."""
    target = gpu_target_for(inputs)
    if target is None:
        return functools.partial(GraphRunner, weights=weights)
    if weights not in (None, "f32"):
        raise UnsupportedError(f"weights={weights!r}: weight-only quantization runs on CPUs; "
                               "the GPU path computes with the model's own weights")
    return functools.partial(GPUGraphRunner, target=target)


class GPUGraphRunner:
    """Calls a lowered graph compiled for `target` with the graph's own (flat) arguments and
    returns its tensors on their device; it answers the report as `GraphRunner` does."""

    # (`GraphRunner.optimized`) no pass pipeline's module to store: graphs on device tensors
    # have no graph-cache key
    optimized = None

    def __init__(self, converted: Converted, label: str = "graph", strict: bool | None = None,
                 *, target: GPUTarget):
        from tilefold.compiler import compile as tilefold_compile

        self.converted, self.label = converted, label
        self.graph = tilefold_compile(converted.module, target=target, strict=strict)
        self.run = self  # the report asks `run` for groups, methods and decisions
        self.executor = f"tilefold.gpu ({target.name})"
        self.cuda_graph = CUDAGraphCall(self.graph) if cuda_graphs_allowed(self.graph) else None

    def groups(self) -> list[tuple[str, str]]:
        """(the op, or a fused group's ops joined by "+", how it runs) per op of the graph."""
        return [("+".join(o.name for o in s.op.regions[0].ops[:-1]) if s.op.name == "fused"
                 else s.op.name, s.how) for s in self.graph.steps]

    def methods(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, how in self.groups():
            counts[how] = counts.get(how, 0) + 1
        return counts

    def decisions(self) -> list[Any]:
        return self.graph.decisions()  # the same `strategy.Decision`s as the CPU's

    def __call__(self, *args: Any) -> list[Any]:
        import numpy as np
        import torch

        tensors = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a  # a size input
                   for a in self.converted.arguments(args)]
        results = (self.cuda_graph or self.graph)(*tensors)
        for i, lead in self.converted.flattened.items():  # as PyTorch sees them
            results[i] = results[i].flatten(0, lead - 1)
        final = [None if i is None else results[i] for i in self.converted.outputs]
        views = self.converted.views
        return final if views is None else views(args, final)


def cuda_graphs_allowed(graph: Any) -> bool:
    """Whether `graph` (a `tilefold.gpu.GPUGraph`) may be captured as a CUDA graph: compiled
    code (not the interpreter), static shapes, no step on the host, not turned off."""
    fn = graph.module[graph.function]
    return (os.environ.get("TILEFOLD_CUDA_GRAPHS", "1").strip() != "0" and not interpreting()
            and all(a.type.is_static for a in fn.args)
            and not any(s.how.startswith("host") for s in graph.steps))


class CUDAGraphCall:
    """`graph` replayed as a CUDA graph over static copies of its inputs: the first call runs it
    (compiling), the second captures it, later ones copy the inputs in and replay; outputs are
    cloned, so a result survives the next replay."""

    def __init__(self, graph: Callable[..., list[Any]]):
        self.graph = graph
        self.calls = 0
        self.captured: Any = None  # (replay, layouts, static inputs, static outputs)

    def __call__(self, *tensors: Any) -> list[Any]:
        self.calls += 1
        layouts = [(t.shape, t.stride(), t.dtype, t.device) for t in tensors]
        if self.captured is None and self.calls >= 2:
            try:
                self._capture(tensors, layouts)
            except Exception as exc:  # a step that cannot be captured: run it as it is
                if strict():
                    why = f"{type(exc).__name__}: {exc}"
                    raise FallbackError(f"tilefold: CUDA graph capture failed ({why}); "
                                        "strict mode refuses to run "
                                        "the graph uncaptured (TILEFOLD_CUDA_GRAPHS=0 turns "
                                        "capture off)") from exc
                log.warning("tilefold: CUDA graph capture failed (%s: %s); running the graph "
                            "directly", type(exc).__name__, exc)
                self.captured = False
        if not self.captured or self.captured[1] != layouts:
            return self.graph(*tensors)
        replay, _, static_in, static_out = self.captured
        for s, t in zip(static_in, tensors, strict=True):
            s.copy_(t)
        replay()
        return [o.clone() for o in static_out]

    def _capture(self, tensors: Sequence[Any], layouts: list) -> None:
        import torch

        static_in = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                     for t in tensors]
        for s, t in zip(static_in, tensors, strict=True):
            s.copy_(t)
        replay, static_out = cuda_capture(lambda: self.graph(*static_in))
        self.captured = (replay, layouts, static_in, static_out)


def cuda_capture(fn: Callable[[], list[Any]]) -> tuple[Callable[[], None], list[Any]]:
    """`fn` captured as a CUDA graph: (replay, the outputs each replay rewrites)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # PyTorch's recipe: a warm-up on a side stream first
        fn()
    torch.cuda.current_stream().wait_stream(side)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        outs = fn()
    return cuda_graph.replay, outs


__all__ = ["CUDAGraphCall", "GPUGraphRunner", "cuda_capture", "cuda_graphs_allowed",
           "gpu_target_for", "runner_factory"]
