"""How a graph's sizes and views cross between PyTorch and the IR: a size input becomes an IR
argument, and an output that is a view goes back as a real view of its base.

A SymInt input (`torch.compile(dynamic=True)` makes Python ints symbolic; a static cache's
`max_cache_len` is one) whose symbol no tensor argument's shape holds enters the IR as an
argument of its own: `u8[?s,0]`, an empty array whose first dim is the size, where the symbol is
a dim of some value (every consumer binds it as it binds any dim), else `i64[]`, the number (an
index, an `alpha`, which may be negative).

An output that views a graph input, or another output, is remade by AOTAutograd from that base
with the sizes, strides and offset of the tensor the backend returned, whenever it cannot replay
the views itself (view arguments that are symbolic): a fresh contiguous result would give the
wrong elements. `ViewReplay` runs those outputs' view ops (the graph's own nodes, no arithmetic)
in PyTorch on the real base, so the runner returns views PyTorch can take them from.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from tilefold import dtypes
from tilefold.ir import Builder, Function, Tensor
from tilefold.ir.dims import free_symbols, is_derived
from tilefold.ir.types import SymDim

# How a size input is passed to the IR function, by kind: its dim carrier or its value.
SIZE_FORMS: dict[str, Callable[[Any], np.ndarray]] = {
    "dim": lambda n: np.empty((int(n), 0), np.uint8),
    "value": lambda n: np.array(int(n), np.int64),
}


def value_argument(builder: Builder, symbol: str) -> Tensor:
    """A new `i64[]` argument holding the size input `symbol` (see the module docstring)."""
    return builder.arg(f"value_{_ident(symbol)}", dtypes.i64, ())


def unheld(function: Function, symbols: Sequence[str]) -> tuple[list[str], list[str]]:
    """Of `symbols` (size inputs), those a dim of the function uses that no argument's type
    holds: (those that are a dim themselves, so never negative: they get a carrier; those only
    inside derived dims, `?(2-s0)`, `?(s0*s1)`, which may be negative: the caller specializes
    them)."""
    held = {d.name for a in function.args for d in a.type.shape  # a sum defines no symbol
            if isinstance(d, SymDim) and not is_derived(d.name)}
    plain, inside = set(), set()
    for op in function.walk():
        dims = [d for v in op.results for d in v.type.shape]
        dims += [d for v in op.attrs.values() if isinstance(v, tuple) for d in v]
        for d in dims:
            if isinstance(d, SymDim):
                (inside if is_derived(d.name) else plain).update(free_symbols(d.name))
    wanted = [s for s in symbols if s in plain | inside and s not in held]
    return [s for s in wanted if s in plain], [s for s in wanted if s not in plain]


def carry_dims(builder: Builder, symbols: Sequence[str]) -> None:
    """A `u8[?s,0]` argument for each of `symbols` (see the module docstring)."""
    for symbol in symbols:
        builder.arg(f"size_{_ident(symbol)}", dtypes.u8, (SymDim(symbol), 0))


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


class ViewReplay:
    """The graph outputs that are views of an input or of another output, made again in
    PyTorch from the real base: `outputs = replay(args, outputs)`."""

    def __init__(self, module: fx.GraphModule, positions: list[int], bases: list[int]):
        self.module, self.positions, self.bases = module, positions, bases

    def __call__(self, args: Sequence[Any], outputs: list[Any]) -> list[Any]:
        made = self.module(*args, *(outputs[k] for k in self.bases))
        for j, view in zip(self.positions, made, strict=True):
            outputs[j] = view
        return outputs

    @staticmethod
    def of(graph: fx.Graph) -> ViewReplay | None:
        """The replay of `graph`'s view outputs, or None when it returns none."""
        (items,) = next(n for n in graph.nodes if n.op == "output").args
        items = list(items) if isinstance(items, list | tuple) else [items]
        at = {n: j for j, n in enumerate(items) if isinstance(n, fx.Node)}
        chains = {j: c for j, n in enumerate(items) if (c := _view_chain(n, at)) is not None}
        if not chains:
            return None
        new = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                env[node] = new.node_copy(node)
        bases = sorted({k for chain in chains.values() for k in chain[1]})
        for k in bases:
            env[items[k]] = new.placeholder(f"base_{k}")
        needed = set().union(*(chain[0] for chain in chains.values()))
        for node in graph.nodes:
            if node in needed and node not in env:
                env[node] = new.node_copy(node, lambda n: env[n])
        new.output(tuple(env[items[j]] for j in chains))
        return ViewReplay(fx.GraphModule(torch.nn.Module(), new), list(chains), bases)


def _view_chain(node: Any, outputs: dict[fx.Node, int]) -> tuple[set[fx.Node], set[int]] | None:
    """(the nodes that make `node` from its base, the output positions of bases that are other
    outputs) when `node` is a view of a graph input or of another output, else None."""
    if not _is_view(node):
        return None
    nodes: set[fx.Node] = set()
    bases: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in nodes or n.op == "placeholder":
            continue
        if n is not node and n in outputs and not _is_view(n) and not _is_size(n):
            bases.add(outputs[n])
            continue
        if not (_is_view(n) or _is_size(n)):
            return None
        nodes.add(n)
        stack += n.all_input_nodes
    return nodes, bases


def _is_view(node: Any) -> bool:
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if node.target is operator.getitem:  # a piece of split or unbind
        return _is_view(node.args[0])
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def _is_size(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return node.op == "call_function" and isinstance(val, int | torch.SymInt | torch.SymBool)
