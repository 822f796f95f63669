"""Shared test helpers: export a function with torch.export, lower it, and compare with PyTorch."""

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
