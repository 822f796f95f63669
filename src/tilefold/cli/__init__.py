"""tilefold.cli layer."""
