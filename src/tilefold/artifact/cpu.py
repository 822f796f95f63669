"""Which of an artifact's CPU features (LLVM's names) this host lacks, read from the kernel's
/proc/cpuinfo flags: no LLVM in the loader.

Most LLVM x86 feature names are the kernel's flag names; `_FLAG` lists those spelled
otherwise. `_NOT_IN_CODE` are system features LLVM reports for a CPU whose instructions
generated code never contains (a kernel may not even list them, e.g. shstk), so they are not
checked. A feature neither known nor listed cannot be checked and is reported as missing:
an artifact is never run on the hope that a host has what its code needs. (The exporter
lists such features of a host's own target apart, as `unchecked_features`; every named
target's features are checked.)
"""

from __future__ import annotations

import os

_FLAG = {
    "64bit": "lm", "evex512": "avx512f", "sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2",
    "sahf": "lahf_lm", "lzcnt": "abm", "bmi": "bmi1", "pclmul": "pclmulqdq",
    "prfchw": "3dnowprefetch",
    "crc32": "sse4_2", "rdrnd": "rdrand", "sha": "sha_ni", "avx512vnni": "avx512_vnni",
    "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni", "amx-tile": "amx_tile",
    "amx-bf16": "amx_bf16", "amx-int8": "amx_int8",
}
_SAME = frozenset((
    "sse", "sse2", "ssse3", "sse4a", "avx", "avx2", "fma", "f16c", "bmi2", "popcnt", "movbe",
    "cx8", "cx16", "cmov", "mmx", "fxsr", "aes", "adx", "vaes", "vpclmulqdq", "gfni", "avx512f",
    "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi", "rdseed",
    "clflushopt", "clwb",
))
_NOT_IN_CODE = frozenset((
    "xsave", "xsavec", "xsaveopt", "xsaves", "fsgsbase", "invpcid", "rdpid", "shstk", "clzero",
    "mwaitx", "wbnoinvd", "pku", "ptwrite", "waitpkg", "movdiri", "movdir64b", "serialize",
    "tsxldtrk", "uintr", "cldemote", "enqcmd", "sgx", "rtm", "kl", "widekl", "hreset", "prefetchi",
    "rdpru", "lwp",
))
_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def host_arch() -> str:
    machine = os.uname().machine.lower()  # what platform.machine() reads, without its import
    return _ARCH.get(machine, machine)


def host_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _flag(feature: str) -> str | None:
    """The /proc/cpuinfo flag showing `feature`, None when no known flag does."""
    return _FLAG.get(feature, feature if feature in _SAME else None)


def cpuinfo_flags(features: list[str]) -> tuple[list[str], list[str]]:
    """The /proc/cpuinfo flags that show a host has `features` (those generated code can
    contain), and the features no known flag shows."""
    flags, unknown = [], []
    for feature in features:
        if feature in _NOT_IN_CODE:
            continue
        flag = _flag(feature)
        if flag is None:
            unknown.append(feature)
        elif flag not in flags:
            flags.append(flag)
    return flags, unknown


def missing_features(features: list[str], flags: frozenset[str] | None = None) -> list[str]:
    """The features of `features` this host does not have, or cannot be shown to have;
    `flags`: a host's /proc/cpuinfo flags instead of this one's (a test's seam: which member
    of a chain another kind of host picks)."""
    host = host_flags() if flags is None else flags
    return [f for f in features if f not in _NOT_IN_CODE and _flag(f) not in host]
