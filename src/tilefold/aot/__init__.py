"""Ahead-of-time export: a compiled module written as an artifact that `tilefold.load` runs
with NumPy alone (the format and the loader are in `tilefold.artifact`)."""

from tilefold.aot.export import export

__all__ = ["export"]
