"""tilefold.runtime layer."""
