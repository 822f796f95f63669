"""The tilefold version, in one place (cache keys and the tuning database include it)."""

__version__ = "0.2.0"
