"""tilefold.strategy layer."""
