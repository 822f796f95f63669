"""tilefold.passes layer."""
