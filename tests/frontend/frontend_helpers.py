"""Shared test helpers: export a function with torch.export, lower it, compare with PyTorch, and
check what a compiled graph ran on."""

from __future__ import annotations

import numpy as np
import torch

from tilefold.frontend import from_exported_program
from tilefold.ir import Module, interpret


class Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def lower(fn, *args, dynamic_shapes=None) -> Module:
    """`fn` exported and lowered; tensors it closes over become constants."""
    shapes = None if dynamic_shapes is None else (dynamic_shapes,)  # forward(*args)
    ep = torch.export.export(Wrap(fn), args, dynamic_shapes=shapes)
    return from_exported_program(ep)


def check(fn, *args, dynamic_shapes=None, atol: float = 1e-5) -> Module:
    """Lower `fn`, run it with the reference interpreter and compare with PyTorch."""
    module = lower(fn, *args, dynamic_shapes=dynamic_shapes)
    got = interpret(module, *(a.numpy() for a in args))
    want = fn(*args)
    want = want if isinstance(want, tuple | list) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == tuple(w.shape) and g.dtype == w.numpy().dtype
        np.testing.assert_allclose(g, w.numpy(), atol=atol, rtol=1e-5)
    return module


# Ops whose group must run a native kernel method: GEMMs, attention and norms (whole, or the
# rsqrt of a decomposed one).
HEAVY = frozenset({"matmul", "scaled_dot_product_attention", "layer_norm", "rms_norm", "rsqrt"})


def assert_native(graphs: list, expect: set[str]) -> None:
    """Every graph ran whole on tilefold.compile, every group holding a `HEAVY` op ran a native
    method (not extern, not the interpreter), and the ops in `expect` were among them."""
    seen: set[str] = set()
    for g in graphs:
        assert g.mode == "tilefold" and g.executor == "tilefold.compile", g.format()
        for names, method in g.groups():
            heavy = HEAVY & set(names.split("+"))
            seen |= heavy
            assert not heavy or method.split(".")[0] not in ("extern", "interpreter"), (
                f"graph {g.graph}: {names} ran on {method}")
    assert expect <= seen, f"expected groups with {sorted(expect)}, saw {sorted(seen)}"
