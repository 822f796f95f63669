"""The ATen lowering rules, one table per family; importing this package registers them all."""

from tilefold.frontend.rules import creation, elementwise, nn, shape

__all__ = ["creation", "elementwise", "nn", "shape"]
