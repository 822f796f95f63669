"""tilefold.frontend layer."""
