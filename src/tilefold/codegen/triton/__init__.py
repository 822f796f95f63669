"""Triton source for memory-bound kernel IR: math table, GPU schedule, emitter, launcher, PTX."""
