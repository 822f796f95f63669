"""The op declarations; importing this package registers every op."""

from tilefold.ir.ops import control, elementwise, linalg, nn, reduce, shape

__all__ = ["control", "elementwise", "linalg", "nn", "reduce", "shape"]
