"""tilefold.codegen layer."""
