"""tilefold.ir layer."""
