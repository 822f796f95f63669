"""tilefold.target layer."""
