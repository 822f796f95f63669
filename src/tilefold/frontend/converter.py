"""Converts an ATen-level FX graph into a tilefold IR function by applying the lowering rules."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy
import torch
import torch.fx as fx

from tilefold.errors import Location, UnsupportedError
from tilefold.frontend import rules  # noqa: F401  (registers every lowering rule)
from tilefold.frontend.context import LoweringContext, Merged, Unavailable
from tilefold.frontend.graph_io import SIZE_FORMS, ViewReplay, carry_dims, unheld
from tilefold.frontend.lowering import NotApplicable, Specialized, rule_for
from tilefold.frontend.symbolic import Composite, Sizes
from tilefold.frontend.tensors import frozen_array, to_numpy
from tilefold.ir import Builder, Module, Tensor
from tilefold.ir.dims import Bindings, is_derived
from tilefold.ir.types import SymDim

# How a placeholder enters the IR: a function argument named `name`, a constant, or a size.
Input = tuple[str, Any]  # ("arg", name) | ("constant", tensor) | ("size", None)


@dataclass(frozen=True)
class SizeOutput:
    """A size the graph returns (a SymInt, such as a cache length): PyTorch gets it back as a
    number, evaluated from the call's argument sizes."""

    dim: int | SymDim | Composite  # a Composite: a product of symbols (AOTAutograd saves
    # `7*s0` for the backward)

    def value(self, sizes: Bindings) -> int:
        if isinstance(self.dim, Composite):
            expr = self.dim.expr
            return int(expr.subs({s: sizes[s.name] for s in expr.free_symbols}))
        return self.dim if isinstance(self.dim, int) else sizes[self.dim.name]


@dataclass
class Converted:
    """A lowered graph: the IR module, which placeholders are its arguments, and what failed."""

    module: Module
    arg_indices: list[int]  # placeholder positions passed to the IR function, in order (SEED)
    outputs: list[Any]  # per graph output: an IR result index, a literal (None) or a SizeOutput
    unsupported: dict[fx.Node, str] = field(default_factory=dict)  # node -> reason
    lowered: dict[str, int] = field(default_factory=dict)  # ATen op -> count
    # placeholder position -> the module's constant array made from it (a frozen weight)
    frozen: dict[int, Any] = field(default_factory=dict)
    # IR result index -> how many leading dims PyTorch sees as one (a `Merged` output: the IR
    # returns it unflattened, and the caller merges them)
    flattened: dict[int, int] = field(default_factory=dict)
    # IR result index -> the placeholder position whose tensor it is written back into (the
    # graph's input mutations: `rules/state.py`), after the graph's own outputs
    mutations: dict[int, int] = field(default_factory=dict)

    # placeholder position -> the symbol of a size argument (a SymInt input), for size outputs
    size_args: dict[int, str] = field(default_factory=dict)
    # IR argument index -> how a size input is passed there ("dim" or "value": `graph_io`)
    size_inputs: dict[int, str] = field(default_factory=dict)
    views: ViewReplay | None = None  # outputs that are views, made again on their bases
    # the module went through `tilefold.compile`'s pass pipeline already (a stored one:
    # `graph_cache`), to be compiled as it is
    optimized: bool = False

    def donated(self) -> dict[int, int]:
        """The mutations as IR result index -> IR argument index (`tilefold.compile`'s donate)."""
        return {r: self.arg_indices.index(p) for r, p in self.mutations.items()}

    def arguments(self, args: Sequence[Any]) -> list[Any]:
        """The IR function's arguments from the graph's: its tensors as they are, each size
        input in its IR form (a NumPy array)."""
        forms = self.size_inputs
        return [SIZE_FORMS[forms[k]](args[p]) if k in forms else draw_seed() if p == SEED
                else args[p] for k, p in enumerate(self.arg_indices)]


SEED = -1  # `Converted.arg_indices`' entry for the random seed: no placeholder, drawn per call


def draw_seed() -> np.ndarray:
    """A new seed for a graph's random ops, drawn from PyTorch's default generator (so
    `torch.manual_seed` repeats a run, and the generator moves on as eager's would)."""
    return np.asarray(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64).item(),
                      np.int64)


def _lowering_arguments(ctx: LoweringContext, result: Converted, sizes: dict[str, int]) -> None:
    """Append the arguments lowering made to the IR function's argument list, in its order:
    the size inputs it takes (`graph_io`) and the random seed (`SEED`)."""
    carried, signed = unheld(ctx.b.function, list(sizes))
    ctx.static(*(SymDim(s) for s in signed))  # maybe negative: no dim can carry them
    carry_dims(ctx.b, carried)
    args = ctx.b.function.args
    symbols = {v.value: s for s, v in ctx.value_args.items()}
    for arg in args[len(result.arg_indices):len(args) - len(carried)]:
        if ctx.seed_arg is not None and arg is ctx.seed_arg.value:
            result.arg_indices.append(SEED)
            continue
        result.size_inputs[args.index(arg)] = "value"
        result.arg_indices.append(sizes[symbols[arg]])
    for symbol in carried:
        result.size_inputs[len(result.arg_indices)] = "dim"
        result.arg_indices.append(sizes[symbol])


def is_size_node(node: fx.Node) -> bool:
    """Nodes computing sizes (sym_size, SymInt arithmetic): evaluated from their recorded value."""
    val = node.meta.get("val")
    return node.op == "call_function" and isinstance(val, int | torch.SymInt | torch.SymBool)


def is_mutation(node: fx.Node) -> bool:
    """A write back into a graph input (`copy_(placeholder, value)`, `rules/state.py`)."""
    return (node.op == "call_function" and node.target is torch.ops.aten.copy_.default
            and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder")


_NO_OPS = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size"}


def _is_no_op(node: fx.Node) -> bool:
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0] in _NO_OPS


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def _location(node: fx.Node) -> Location | None:
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    if not frames:
        return None
    file, line = frames[-1]
    return Location(file.rsplit("/", 1)[-1], int(line), 1)


def convert_graph(
    graph: fx.Graph,
    inputs: Callable[[int, fx.Node], Input],
    *,
    name: str = "main",
    dim_names: dict[str, str] | None = None,
    trial: bool = False,
) -> Converted:
    """Lower `graph` into one IR function.

    `inputs(i, placeholder)` says how the i-th placeholder enters. Without `trial`, the first
    node no rule lowers raises UnsupportedError naming every such node; with `trial`, such
    nodes are recorded and their results become fresh function arguments, so that one pass
    finds every unsupported node (the partitioner's question); a trial that finds none has
    built the module, as a plain conversion would. A rule that specializes symbolic sizes
    (`Specialized`) makes the conversion start over, those sizes now constants.
    """
    while True:  # each start over fixes at least one more symbol, so this ends
        try:
            return _convert(graph, inputs, name, dim_names, trial)
        except Specialized:
            continue


def _convert(graph: fx.Graph, inputs: Callable[[int, fx.Node], Input], name: str,
             dim_names: dict[str, str] | None, trial: bool) -> Converted:
    b = Builder(name)
    ctx = LoweringContext(b, Sizes(dim_names))
    result = Converted(b.module, [], [])
    constants: dict[int, Tensor] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        kind, payload = inputs(i, node)
        if kind == "size":
            ctx.env[node] = ctx.size(node)
            if isinstance(ctx.env[node], SymDim):
                result.size_args[i] = ctx.env[node].name
                if not is_derived(ctx.env[node].name):
                    ctx.size_inputs.setdefault(ctx.env[node].name, i)
        elif kind == "constant":
            key = id(payload)
            if key not in constants:
                # the weight's own memory: the runner re-lowers when PyTorch changes it
                constants[key] = b.constant(frozen_array(payload), copy=False)
                result.frozen[i] = constants[key].value.defining_op.attrs["value"]
            ctx.env[node] = constants[key]
        else:
            ctx.env[node] = _argument(ctx, node, payload, result)
            result.arg_indices.append(i)
    outputs: list[Tensor] = []
    blocked: set[fx.Node] = set()  # without trial: nodes downstream of an unsupported one
    for node in graph.nodes:
        if not trial and any(a in result.unsupported or a in blocked for a in node.all_input_nodes):
            blocked.add(node)
        elif node.op == "call_function":
            ctx.node = node
            b.loc = _location(node)
            try:
                ctx.env[node] = _lower(ctx, node)
                key = op_name(node)
                result.lowered[key] = result.lowered.get(key, 0) + 1
            except NotApplicable as exc:
                result.unsupported[node] = exc.reason
                ctx.env[node] = _stand_in(ctx, node, result) if trial else None
        elif node.op == "get_attr":
            try:
                ctx.env[node] = _attribute(ctx, graph, node)
            except NotApplicable as exc:
                result.unsupported[node] = exc.reason
                ctx.env[node] = Unavailable(f"{node.name}: {exc.reason}")
        elif node.op == "output":
            outputs = _outputs(ctx, node, result)
    if result.unsupported:
        if not trial:
            raise UnsupportedError(describe_unsupported(result.unsupported))
        return result
    position = {node: i for i, node in enumerate(placeholders)}
    for node, value in ctx.mutations.items():
        result.mutations[len(outputs)] = position[node]
        outputs.append(value)
    _lowering_arguments(ctx, result, ctx.size_inputs)
    result.views = ViewReplay.of(graph)
    b.build(*outputs)
    return result


def _argument(ctx: LoweringContext, node: fx.Node, name: str, result: Converted) -> Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise UnsupportedError(f"input {node.name} is {type(val).__name__}, not a tensor")
    try:
        shape = ctx.dims(val.shape)
        dtype = ctx.dtype(val.dtype)
    except NotApplicable as exc:
        raise UnsupportedError(f"input {node.name}: {exc.reason}") from None
    return ctx.b.arg(_ident(name), dtype, shape)


def _attribute(ctx: LoweringContext, graph: fx.Graph, node: fx.Node) -> Tensor:
    """A tensor the graph's module holds (a constant Dynamo lifted, such as a `torch.tensor`
    literal) as an IR constant of its own: a copy, so later writes to it cannot reach ours."""
    found: Any = graph.owning_module
    for part in str(node.target).split("."):
        found = getattr(found, part, None)
    if not isinstance(found, torch.Tensor):
        raise NotApplicable(f"get_attr {node.target} is {type(found).__name__}, not a tensor")
    return ctx.b.constant(np.array(to_numpy(found)))


def _ident(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _stand_in(ctx: LoweringContext, node: fx.Node, result: Converted) -> Any:
    """In trial mode, an unsupported node's results enter as fresh arguments."""
    val = node.meta.get("val")
    vals = val if isinstance(val, list | tuple) else [val]
    outs: list[Any] = []
    for v in vals:
        try:
            outs.append(ctx.b.arg(ctx.b.function.fresh_name(f"{node.name}_"),
                                  ctx.dtype(v.dtype), ctx.dims(v.shape, specialize=False)))
        except (NotApplicable, AttributeError):
            outs.append(Unavailable(f"{node.name} runs outside tilefold"))
    return outs if isinstance(val, list | tuple) else outs[0]


def _lower(ctx: LoweringContext, node: fx.Node) -> Any:
    if _is_no_op(node):
        return None
    if is_size_node(node):
        return ctx.size(node)
    if node.target is operator.getitem:
        return _getitem(ctx, *node.args)
    if node.target is torch.sym_float:  # a SymInt used as a float: the same size, cast later
        return ctx.value(node.args[0])
    rule = rule_for(node.target)
    if rule is None:
        raise NotApplicable(f"no lowering rule for {op_name(node)}")
    value = rule.fn(ctx, *node.args, **node.kwargs)
    _check(ctx, node, value)
    return value


def _getitem(ctx: LoweringContext, seq: Any, index: int) -> Any:
    found = ctx.env[seq]
    if not isinstance(found, list | tuple):
        raise NotApplicable(f"getitem on {type(found).__name__}")
    item = found[index]
    if isinstance(item, Unavailable):
        raise NotApplicable(item.reason)
    return item


def _check(ctx: LoweringContext, node: fx.Node, value: Any) -> None:
    """A rule's result must have the type PyTorch recorded; a mismatch is NotApplicable."""
    val = node.meta.get("val")
    pairs = zip(value, val, strict=True) if isinstance(value, list | tuple) else [(value, val)]
    for got, want in pairs:
        if not isinstance(want, torch.Tensor) or isinstance(got, Unavailable):
            continue
        if isinstance(got, Merged):
            shape = (ctx.sizes.product(got.tensor.shape[: got.lead]), *got.tensor.shape[got.lead:])
            dtype = got.tensor.dtype
        elif isinstance(got, Tensor):
            shape, dtype = got.shape, got.dtype
        else:
            raise NotApplicable(f"rule returned {got!r} for a tensor")
        ok = len(shape) == want.dim() and all(
            ctx.sizes.same(a, w) for a, w in zip(shape, want.shape, strict=True)
        )
        if not ok or dtype != ctx.dtype(want.dtype):
            raise NotApplicable(
                f"lowered to {dtype}[{','.join(map(str, shape))}] but PyTorch computes "
                f"{want.dtype} {list(want.shape)}"
            )


def _outputs(ctx: LoweringContext, node: fx.Node, result: Converted) -> list[Tensor]:
    (out,) = node.args
    items = list(out) if isinstance(out, list | tuple) else [out]
    values: list[Tensor] = []
    for item in items:
        if item is None:
            result.outputs.append(None)
            continue
        try:
            found = ctx.value(item)
            if isinstance(found, int | SymDim):
                result.outputs.append(SizeOutput(found))
                continue
            if isinstance(found, Composite):  # its symbols by their IR names
                names = ctx.sizes.names
                expr = found.expr.subs({s: sympy.Symbol(names.get(s.name, s.name))
                                        for s in found.expr.free_symbols})
                result.outputs.append(SizeOutput(Composite(expr)))
                continue
            if isinstance(found, Merged):
                result.flattened[len(values)] = found.lead
                found = found.tensor
            values.append(found if isinstance(found, Tensor) else ctx.tensor(item))
        except NotApplicable as exc:
            result.unsupported[item] = f"output: {exc.reason}"
            return []
        result.outputs.append(len(values) - 1)
    return values


def describe_unsupported(unsupported: dict[fx.Node, str]) -> str:
    lines = [f"{len(unsupported)} node(s) cannot be lowered to tilefold IR:"]
    lines += [f"  {op_name(n)} ({n.name}): {why}" for n, why in unsupported.items()]
    return "\n".join(lines)
