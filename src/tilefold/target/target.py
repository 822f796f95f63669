"""The `Target` record: what a CPU is, as the code generators need to know it."""

from __future__ import annotations

from dataclasses import dataclass

from tilefold.target.host_cpu import host_cpu


@dataclass(frozen=True)
class Target:
    """One CPU to generate code for: ISA, register file, caches and a kernel fallback chain.

    `features` holds the LLVM names (no '+') that code generators test with `has`;
    `disabled_features` lists features the CPU name would imply but this machine lacks
    (a detected host inside a VM), so `llvm_features` can switch them off for LLVM.
    """

    name: str
    arch: str
    triple: str
    cpu: str
    features: frozenset[str]
    vector_bits: int
    vector_registers: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    cores: int
    family: tuple[str, ...]
    disabled_features: frozenset[str] = frozenset()

    def has(self, *features: str) -> bool:
        """True when every named LLVM feature (e.g. "avx512bf16", "amx-tile") is available."""
        return all(f in self.features for f in features)

    def llvm_features(self) -> str:
        """The feature string for an LLVM target machine: "+avx2,+fma,...,-amx-fp16"."""
        on = [f"+{f}" for f in sorted(self.features)]
        off = [f"-{f}" for f in sorted(self.disabled_features)]
        return ",".join(on + off)

    def is_host(self) -> bool:
        """Whether code compiled for this target can run on this machine."""
        cpu = host_cpu()
        return self.arch == cpu.arch and self.features <= cpu.features

    def __str__(self) -> str:
        return f"{self.name} ({self.arch}, {self.vector_bits}-bit SIMD)"
