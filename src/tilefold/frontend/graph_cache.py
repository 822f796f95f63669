"""Warm starts without AOTAutograd: lowered Dynamo graphs kept on disk as IR text.

A warm `torch.compile` spent 0.45-0.9 s of its ~2 s re-tracing the model to ATen (inductor
skips that with its own AOTAutograd cache). Here a graph that lowered whole is stored under a
key of Dynamo's graph code and its inputs' metadata; the next process parses the IR, binds the
frozen weights of *its* model to the constants by name (the text never holds weights, so a
model with the same architecture and other weights gets its own), and skips the trace.

A graph with no frozen weight (a training graph, an optimizer step: every tensor an
argument) is stored as the module `tilefold.compile`'s pass pipeline made of it (`optimized`),
so a hit compiles it as it is and skips the pipeline; the key then covers the passes (their
sources' digest and the pipeline, weights format included). A graph with frozen weights keeps
the lowered module: the passes make new constants of its weights (folded, quantized), which
the text could not name.

Only graphs whose call needs none of AOTAutograd's runtime wrapping are stored: every shape
static, inputs mutated only inside the graph (a KV cache's writes, which the runner lands in
the caller's tensors itself), no output aliasing an input (an output that is a view of
another, a training forward's view of a tensor it saves, is stored as its view ops and made
again: `_views_record`), and no submodules
(tensor attributes, an optimizer step's parameters and state, are inputs as AOTAutograd lifts
them: `lifted`). Files are JSON written atomically; a corrupt or
foreign one is reported and ignored. `TILEFOLD_GRAPH_CACHE=0` turns the cache off (say, while
changing a lowering rule in place); `=write` stores without loading (a cold compile, timed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from tilefold.errors import TilefoldError
from tilefold.frontend.converter import Converted
from tilefold.frontend.graph_io import ViewReplay
from tilefold.frontend.tensors import frozen_array
from tilefold.ir import Module, parse_module, print_module
from tilefold.runtime import source_digest
from tilefold.target import cache_dir
from tilefold.version import __version__

log = logging.getLogger("tilefold.frontend")
SCHEMA = 3  # 2: entries say which inputs the graph writes; 3: and whether the text is optimized
# The code that decides what IR a graph lowers to: part of every key.
_LOWERING = ("tilefold.frontend", "tilefold.frontend.rules", "tilefold.ir", "tilefold.ir.ops")
# And the code that decides what an optimized module is (with the pipeline: `passes`).
_PASSES = ("tilefold.passes",)
# IR text above this size (constants not from inputs, printed inline) is not worth a file.
MAX_TEXT_BYTES = 4 << 20


@dataclass(frozen=True)
class Entry:
    """A stored lowering: the IR text (weights as names `input:<i>`) and how to call it."""

    text: str
    arg_indices: list[int]
    outputs: list[int | None]
    frozen: list[int]
    lowered: dict[str, int]
    aten_nodes: int
    mutations: dict[int, int]  # IR result index -> the input it writes (`Converted.mutations`)
    optimized: bool  # the text is the module after `tilefold.compile`'s pass pipeline
    views: dict[str, Any] | None  # the outputs that are views, made again (`_views_record`)


def _attributes(gm: fx.GraphModule) -> dict[str, Any]:
    """The graph module's parameters, then its buffers, by name, as AOTAutograd lifts them."""
    return {**dict(gm.named_parameters(remove_duplicate=False)),
            **dict(gm.named_buffers(remove_duplicate=False))}


def lifted(gm: fx.GraphModule) -> list[Any]:
    """The tensors AOTAutograd passes the ATen graph before Dynamo's inputs: the graph
    module's parameters, then its buffers (the tensors its `get_attr` nodes read, e.g. an
    optimizer step's parameters and state)."""
    return list(_attributes(gm).values())


def graph_key(gm: fx.GraphModule, example_inputs: list[Any], extra: Any = None,
              weights: str | None = None) -> str | None:
    """The key of this graph and these inputs (the `lifted` attributes first), or None when
    the graph may not be stored; `extra` (JSON) is whatever else decides the lowering (the
    training path's AOTAutograd configuration); `weights` is the compile's weights format
    (`tilefold.compile`'s, which picks the pass pipeline)."""
    if _mode() == "0":
        return None
    attributes = _attributes(gm)
    if any(n.op == "call_module" or (n.op == "get_attr" and n.target not in attributes)
           for n in gm.graph.nodes):
        return None  # (an attribute AOTAutograd does not lift is a constant the key lacks)
    first: dict[int, int] = {}
    metas = []
    for i, x in enumerate([*attributes.values(), *example_inputs]):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return None
        if any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride())):
            return None
        # Which earlier input this one is (tied weights lower to one constant).
        same = first.setdefault(id(x), i)
        metas.append([list(x.shape), list(x.stride()), str(x.dtype),
                      isinstance(x, torch.nn.Parameter), x.is_inference(), x.requires_grad,
                      same])
    from tilefold.compiler import pipeline

    fields = {"schema": SCHEMA, "tilefold": __version__, "torch": torch.__version__,
              "lowering": source_digest(*_LOWERING), "code": gm.code, "inputs": metas,
              "grad": torch.is_grad_enabled(), "extra": extra,
              "passes": [source_digest(*_PASSES), pipeline(weights)]}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _mode() -> str:
    return os.environ.get("TILEFOLD_GRAPH_CACHE", "1").strip().lower()


def _path(key: str) -> Path:
    return cache_dir() / "graphs" / f"{key}.json"


def storable() -> bool:
    """Whether the graph AOTAutograd is compiling needs no runtime wrapping (call inside the
    inference compiler)."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return False
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType

    return (all(not i.mutates_metadata and (not i.mutates_data or
                                            i.mutation_type == MutationType.MUTATED_IN_GRAPH)
                for i in meta.input_info)
            and all(o.output_type == OutputType.non_alias for o in meta.output_info)
            and meta.num_intermediate_bases == 0 and not meta.tokens)


def store(key: str, converted: Converted, aten_nodes: int, optimized: Module | None = None
          ) -> bool:
    """Write the lowering atomically; whether it was stored (a failure to write is logged,
    never raised). `optimized` is the module the pass pipeline made of `converted.module`
    (`GraphRunner.optimized`), stored instead where no weight is frozen."""
    views = None if converted.views is None else _views_record(converted.views)
    if converted.flattened or (converted.views is not None and views is None) or \
            not all(o is None or isinstance(o, int) for o in converted.outputs):
        return False  # (flattened outputs come only from symbolic graphs: no key)
    names = {id(array): f"input:{i}" for i, array in converted.frozen.items()}
    post = optimized is not None and not converted.frozen
    text = print_module(optimized if post else converted.module, external=names)
    if len(text) > MAX_TEXT_BYTES:
        return False
    return store_record(key, {
        "text": text, "arg_indices": converted.arg_indices, "outputs": converted.outputs,
        "frozen": sorted(converted.frozen), "lowered": converted.lowered,
        "aten_nodes": aten_nodes, "mutations": [[r, p] for r, p in converted.mutations.items()],
        "optimized": post, "views": views})


def load(key: str) -> Entry | None:
    """The stored lowering under `key`; None when there is none, it is unreadable, or the cache
    only writes."""
    data = load_record(key)
    try:
        return None if data is None else Entry(
            data["text"], data["arg_indices"], data["outputs"], data["frozen"],
            data["lowered"], data["aten_nodes"], {int(r): int(p) for r, p in data["mutations"]},
            bool(data["optimized"]), data["views"])
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("tilefold: ignoring the stored graph %s (%s); lowering afresh",
                    _path(key), exc)
        return None


def store_record(key: str, record: dict[str, Any]) -> bool:
    """Write `record` (JSON) under `key` atomically; whether it was written."""
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".graph-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"schema": SCHEMA, "key": key, **record}, f)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.warning("tilefold: could not store the lowered graph in %s: %s", path, exc)
        return False


def load_record(key: str) -> dict[str, Any] | None:
    """The record stored under `key`; None when there is none, it is unreadable or foreign,
    or the cache only writes."""
    if _mode() == "write":
        return None
    path = _path(key)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("key") != key:
            raise ValueError("written by another version")
        return data
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("tilefold: ignoring the stored graph %s (%s); lowering afresh", path, exc)
        return None


def converted(entry: Entry, real: list[Any]) -> Converted:
    """The stored lowering with `real`'s frozen weights bound to its constants."""
    bound = {f"input:{i}": frozen_array(real[i]) for i in entry.frozen}
    module = parse_module(entry.text, "<graph cache>", bound=bound)
    return Converted(module, list(entry.arg_indices), list(entry.outputs),
                     lowered=dict(entry.lowered), mutations=dict(entry.mutations),
                     optimized=entry.optimized,
                     views=None if entry.views is None else _replay(entry.views))


# What a stored view replay's nodes may hold besides other nodes (static graphs: plain sizes).
_PLAIN = (int, float, bool, type(None))


def _views_record(views: ViewReplay) -> dict[str, Any] | None:
    """A replay of view outputs (`graph_io.ViewReplay`: the graph's own view ops, e.g. a
    forward's logits returned as a view of the saved tensor) as JSON: each node's op, name,
    target and arguments; None when a node is other than a placeholder, a view op or a
    `getitem` of one, or takes other than nodes and plain numbers."""
    nodes = []
    for node in views.module.graph.nodes:
        target = None
        if node.op == "call_function":
            if node.target is operator.getitem:
                target = "getitem"
            elif isinstance(node.target, torch._ops.OpOverload) and node.target.is_view:
                target = f"{node.target.name()}.{node.target._overloadname}"
            else:
                return None
        elif node.op not in ("placeholder", "output"):
            return None
        try:
            args = _jsonable(node.args)
        except TypeError:
            return None
        if node.kwargs:
            return None
        nodes.append([node.op, node.name, target, args])
    return {"nodes": nodes, "positions": views.positions, "bases": views.bases}


def _jsonable(arg: Any) -> Any:
    if isinstance(arg, fx.Node):
        return {"node": arg.name}
    if isinstance(arg, list | tuple):
        return [_jsonable(a) for a in arg]
    if isinstance(arg, _PLAIN):
        return arg
    raise TypeError(f"a view argument of type {type(arg).__name__}")


def _replay(record: dict[str, Any]) -> ViewReplay:
    """The replay `_views_record` wrote (a TilefoldError where the record is not one)."""
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, dict):
            return env[a["node"]]
        return tuple(arg(x) for x in a) if isinstance(a, list) else a

    try:
        for op, name, target, args in record["nodes"]:
            if op == "placeholder":
                env[name] = graph.placeholder(name)
            elif op == "output":
                graph.output(arg(args)[0])
            else:
                env[name] = graph.call_function(_view_op(target), arg(args))
        return ViewReplay(fx.GraphModule(torch.nn.Module(), graph),
                          [int(j) for j in record["positions"]],
                          [int(k) for k in record["bases"]])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TilefoldError(f"a stored view replay that is not one: {exc}") from exc


def _view_op(target: str) -> Any:
    """The view op a record names (`aten::view.default`), or `operator.getitem`."""
    if target == "getitem":
        return operator.getitem
    namespace, rest = target.split("::")
    name, overload = rest.split(".")
    op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    if not op.is_view:
        raise ValueError(f"{target} is not a view op")
    return op
