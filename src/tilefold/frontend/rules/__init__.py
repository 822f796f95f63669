"""The ATen lowering rules, one table per family; importing this package registers them all."""

from tilefold.frontend.rules import conv, creation, elementwise, nn, quant, shape, state

__all__ = ["conv", "creation", "elementwise", "nn", "quant", "shape", "state"]
