"""The array namespace of a NumPy array or a torch tensor, in the array API's names.

IR meanings that must run on both kinds of array (the views of layout ops: `OpDef.view`) are
written once against `namespace(x)`, as array-API code is written against `xp`, beside the
methods NumPy arrays and torch tensors share (`x.reshape`, basic indexing). Only the functions
those meanings use are here; torch is never imported for it (an array that is a tensor means
torch is loaded already).
"""

from __future__ import annotations

import functools
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np

from tilefold.errors import UnsupportedError

# np.permute_dims is NumPy 2's name for np.transpose (tilefold accepts NumPy 1.24 too).
_NUMPY = SimpleNamespace(name="numpy", reshape=np.reshape, permute_dims=np.transpose,
                         broadcast_to=np.broadcast_to)


@functools.cache
def _torch() -> SimpleNamespace:
    import torch

    return SimpleNamespace(name="torch", reshape=torch.reshape, permute_dims=torch.permute,
                           broadcast_to=torch.broadcast_to)


def namespace(x: Any) -> SimpleNamespace:
    """`reshape`, `permute_dims` and `broadcast_to` for `x`'s kind of array."""
    if isinstance(x, np.ndarray | np.generic):
        return _NUMPY
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch()
    raise UnsupportedError(f"an array of type {type(x).__name__}: tilefold's array code runs on "
                           "NumPy arrays and torch tensors; convert it to one of them first")
