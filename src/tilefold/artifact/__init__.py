"""Exported artifacts: their format on disk and the loader that runs them with NumPy and ctypes
alone (`tilefold.export` writes them; see docs/ARCHITECTURE.md, "Ahead of time")."""

from tilefold.artifact.load import LoadedModel, load

__all__ = ["LoadedModel", "load"]
