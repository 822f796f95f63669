"""Warm training starts without AOTAutograd: a Dynamo graph's forward and backward lowerings
on disk, and the autograd.Function AOTAutograd builds around them made again from a record.

A warm start had spent ~5 s of MiniLM's first step in AOTAutograd's trace of the joint
forward+backward graph and its partition (Inductor skips that with its own AOTAutograd cache).
Here the two lowered graphs are stored by `graph_cache` (`<key>-forward`, `<key>-backward`)
under the key of Dynamo's graph, its inputs' metadata (requires_grad included) and
AOTAutograd's configuration, and a record `<key>` (written last: a record names graphs that
exist) says how AOTAutograd called them (`Joint`). A hit builds the same call: the forward's
results are the user's outputs then the tensors saved for the backward (a view saved
detached), an output AOTAutograd found to be the only view of an intermediate
(`unsafe_view_alias`: GPT-2's logits reshaped for the loss) made a plain tensor on the same
memory as AOTAutograd makes it (`_unsafe_view`), outputs that do not require grad marked
non-differentiable, each incoming gradient coerced to the size and stride its tangent was
traced with, the backward's results one gradient per input. Both graphs are stored as the
pass pipeline made them (no weight of a training graph is frozen: `graph_cache`).

Only calls that need none of AOTAutograd's other runtime wrapping are stored (`joint`): no
input written (batch norm's running statistics, an optimizer's state), no output aliasing an
input or another output (aliasing an intermediate only where AOTAutograd hides it, above), no
symbolic size, no tensor subclass, no duplicated input, no effect token, no autocast, no
compiled autograd (which calls AOTAutograd's own backward as it is, but would trace a hit's
into a graph of its own); those graphs are traced in every process, as before. A graph with
random ops (dropout) is stored like any other: its lowering draws its seed from PyTorch's
generator at each call (`converter.SEED`), hit or miss, so AOTAutograd's RNG
functionalization (off by default) is the only random wrapping refused.
Files are JSON, never pickles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from tilefold.frontend import graph_cache

FORWARD, BACKWARD = "forward", "backward"


@dataclass(frozen=True)
class Joint:
    """How AOTAutograd calls a forward and a backward graph."""

    inputs: int  # forward placeholders: the lifted attributes, then Dynamo's inputs
    outputs: int  # the user's outputs lead the forward's results; the rest are saved
    differentiable: list[bool]  # per user output: whether it requires grad
    tangents: list[tuple[int, list[int], list[int]]]  # the backward's gradients: (output,
    # size, stride), after the saved tensors
    detach: list[int]  # inputs detached before the call (not leaves, no gradient)
    unsafe_views: list[int]  # user outputs AOTAutograd returns through `_unsafe_view`

    def record(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "outputs": self.outputs,
                "differentiable": self.differentiable,
                "tangents": [list(t) for t in self.tangents], "detach": self.detach,
                "unsafe_views": self.unsafe_views}


def key(gm: fx.GraphModule, example_inputs: list[Any], weights: str | None = None
        ) -> str | None:
    """The key of a training graph compiled with `weights` (`tilefold.compile`'s), or None
    when it may not be stored."""
    if torch._C._is_any_autocast_enabled() or torch._dynamo.config.compiled_autograd or any(
            type(x) not in (torch.Tensor, torch.nn.Parameter)
            for x in [*graph_cache.lifted(gm), *example_inputs]):
        return None
    config = torch._functorch.config.save_config_portable()
    return graph_cache.graph_key(gm, example_inputs,
                                 extra={"training": sorted(map(repr, config.items()))},
                                 weights=weights)


def _outputs(gm: fx.GraphModule) -> list[Any]:
    return list(next(iter(reversed(gm.graph.find_nodes(op="output")))).args[0])


def forward_facts(fw_gm: fx.GraphModule) -> dict[str, Any] | None:
    """What the record needs of the forward graph and AOTAutograd's metadata (inside the
    forward compiler), or None when the call needs wrapping a hit does not rebuild."""
    from torch._functorch._aot_autograd.schemas import (
        MutationType,
        OutputType,
        PlainTensorMeta,
    )

    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return None
    placeholders = fw_gm.graph.find_nodes(op="placeholder")
    saved = _outputs(fw_gm)[meta.num_outputs:]
    tangent_metas = meta.subclass_tangent_meta
    simple = (
        len(placeholders) == len(meta.input_info)
        and all(i.mutation_type == MutationType.NOT_MUTATED and not i.mutates_metadata
                and not i.mutates_data for i in meta.input_info)
        and all(o.output_type in (OutputType.non_alias, OutputType.unsafe_view_alias)
                and not o.dynamic_dims
                and isinstance(o.raw_type, type) and issubclass(o.raw_type, torch.Tensor)
                for o in meta.output_info)
        and meta.num_intermediate_bases == 0 and not meta.tokens
        and not meta.num_backward_tokens and not meta.is_rng_op_functionalized
        and meta.grad_enabled_mutation is None
        and not meta.num_tensors_saved_with_no_vc_check
        and all(isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)
                for n in saved)
        and all(isinstance(m, PlainTensorMeta) and m.memory_format is not None
                and m.memory_format.size is not None for m in tangent_metas))
    if not simple:
        return None
    surviving = [i for i, o in enumerate(meta.output_info) if o.requires_grad_for_backward]
    if len(surviving) != len(tangent_metas):
        return None
    return {"inputs": len(placeholders), "outputs": meta.num_outputs, "saved": len(saved),
            "differentiable": [bool(o.requires_grad) for o in meta.output_info],
            "tangents": [(i, [int(d) for d in m.memory_format.size],
                          [int(d) for d in m.memory_format.stride])
                         for i, m in zip(surviving, tangent_metas, strict=True)],
            "grad_leaves": [(bool(i.requires_grad), bool(i.is_leaf)) for i in meta.input_info],
            "unsafe_views": list(meta.unsafe_view_out_indices)}


def joint(facts: dict[str, Any], bw_gm: fx.GraphModule) -> Joint | None:
    """The record of a call from the forward's facts and the backward graph."""
    outs = _outputs(bw_gm)
    placeholders = bw_gm.graph.find_nodes(op="placeholder")
    if len(outs) != facts["inputs"] or \
            len(placeholders) != facts["saved"] + len(facts["tangents"]):
        return None
    detach = [i for i, (out, (grad, leaf)) in enumerate(zip(outs, facts["grad_leaves"],
                                                              strict=True))
              if out is None and grad and not leaf]
    return Joint(facts["inputs"], facts["outputs"], facts["differentiable"],
                 [tuple(t) for t in facts["tangents"]], detach, facts["unsafe_views"])


def store(graph_key: str, joint: Joint, parts: dict[str, tuple[Any, int, Any]]) -> bool:
    """Store both lowerings (`parts[FORWARD|BACKWARD]`: a `Converted`, its ATen node count,
    the module the pass pipeline made of it: `graph_cache.store`), then the record naming
    them."""
    return all(graph_cache.store(f"{graph_key}-{part}", *parts[part])
               for part in (FORWARD, BACKWARD)) and \
        graph_cache.store_record(graph_key, {"joint": joint.record()})


def load(graph_key: str) -> tuple[Joint, graph_cache.Entry, graph_cache.Entry] | None:
    """The stored call and its two lowerings, or None."""
    record = graph_cache.load_record(graph_key)
    if record is None:
        return None
    try:
        data = record["joint"]
        stored = Joint(int(data["inputs"]), int(data["outputs"]),
                       [bool(d) for d in data["differentiable"]],
                       [(int(i), [int(d) for d in size], [int(d) for d in stride])
                        for i, size, stride in data["tangents"]],
                       [int(i) for i in data["detach"]],
                       [int(i) for i in data["unsafe_views"]])
    except (KeyError, TypeError, ValueError):
        return None
    forward = graph_cache.load(f"{graph_key}-{FORWARD}")
    backward = graph_cache.load(f"{graph_key}-{BACKWARD}")
    return None if forward is None or backward is None else (stored, forward, backward)


def _coerced(grad: Any, size: list[int], stride: list[int]) -> Any:
    """An incoming gradient in the layout its tangent was traced with (AOTAutograd's
    `coerce_to_expected_memory_format`)."""
    if not isinstance(grad, torch.Tensor) or (list(grad.shape) == size and
                                              list(grad.stride()) == stride):
        return grad
    laid = torch.empty_strided(size, stride, dtype=grad.dtype, device=grad.device)
    laid.copy_(grad)
    return laid


def function(joint: Joint, forward: Callable[..., Any], backward: Callable[..., Any]
             ) -> Callable[..., list[Any]]:
    """The compiled callable (all inputs, the lifted attributes first) running `forward` and,
    through autograd, `backward`, as AOTAutograd's `CompiledFunction` calls them (`backward`
    boxed: one list of the saved tensors and the gradients, which it takes over)."""

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> tuple[Any, ...]:
            results = list(forward(*args))
            saved = results[joint.outputs:]
            ctx.save_for_backward(*[t.detach() if t._is_view() else t for t in saved])
            outs = results[:joint.outputs]
            for i in joint.unsafe_views:  # AOTAutograd's `finalize`: no view for autograd
                outs[i] = torch.ops.aten._unsafe_view(outs[i], outs[i].shape)
            ctx.mark_non_differentiable(*[o for o, d in zip(outs, joint.differentiable,
                                                            strict=True)
                                          if not d and isinstance(o, torch.Tensor)])
            ctx._materialize_non_diff_grads = False
            return tuple(outs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
            args = list(ctx.saved_tensors)  # handed over: `backward` empties the list
            ctx.maybe_clear_saved_tensors()
            args += [_coerced(grads[i], size, stride) for i, size, stride in joint.tangents]
            return tuple(backward(args))

    def call(*args: Any) -> list[Any]:
        args_ = list(args)
        for i in joint.detach:
            args_[i] = args_[i].detach()
        replay = torch._C._is_view_replay_enabled()
        try:
            torch._C._set_view_replay_enabled(True)
            with torch.enable_grad():
                return list(CompiledFunction.apply(*args_))
        finally:
            torch._C._set_view_replay_enabled(replay)

    return call
