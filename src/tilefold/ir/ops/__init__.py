"""The op declarations; importing this package registers every op."""

from tilefold.ir.ops import control, elementwise, linalg, nn, reduce, shape
from tilefold.ir.ops import fusion as fusion  # the fused-region op of the fusion pass

__all__ = ["VIEWS", "control", "elementwise", "linalg", "nn", "reduce", "shape"]
from tilefold.ir.opdef import OPS, View
from tilefold.ir.ops import attention as attention  # scaled_dot_product_attention
from tilefold.ir.ops import collectives as collectives  # all_reduce, all_gather, redistribute, ...
from tilefold.ir.ops import index as index  # arange, advanced index
from tilefold.ir.ops import quant as quant  # quantize, dequantize
from tilefold.ir.ops import random as random  # random_uniform (counter-based, seeded)
from tilefold.ir.ops import rank_collectives as rank_collectives  # spmd.all_reduce, ...
from tilefold.ir.ops import rank_index as rank_index  # spmd.axis_index

# Every op whose result is a view of its operand -> that view (`OpDef.view`), for NumPy arrays
# and torch tensors alike: the one table the compiled graphs and the extern method read.
VIEWS: dict[str, View] = {name: d.view for name, d in OPS.items() if d.view is not None}
