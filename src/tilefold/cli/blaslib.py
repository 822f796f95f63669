"""The vendor libraries a benchmark compares with: which BLAS kernels NumPy and PyTorch run, and
forcing them to a core type or ISA, which they read once when they load (so in a new process)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

CORETYPE = "OPENBLAS_CORETYPE"  # OpenBLAS: the kernel set, e.g. Haswell, SkylakeX, Zen
MKL_ISA = "MKL_ENABLE_INSTRUCTIONS"  # MKL: the highest ISA it dispatches to, e.g. AVX2, AVX512


def forced_env(coretype: str | None, mkl_isa: str | None) -> dict[str, str]:
    """The environment variables that force the libraries as asked (none when not asked)."""
    wanted = {CORETYPE: coretype, MKL_ISA: mkl_isa}
    return {name: value for name, value in wanted.items() if value}


def needs_new_process(env: dict[str, str]) -> bool:
    """Whether this process's libraries loaded without the forcing `env` asks for."""
    return any(os.environ.get(name) != value for name, value in env.items())


def rerun(argv: list[str], env: dict[str, str]) -> int:
    """Run `tilefold ARGV` in a new process with `env` added (its output goes straight to ours):
    its exit status."""
    command = [sys.executable, "-m", "tilefold.cli.main", *argv]
    return subprocess.run(command, env={**os.environ, **env}, check=False).returncode


def numpy_blas() -> dict[str, Any]:
    """threadpoolctl's record of the BLAS NumPy calls (internal_api, version, architecture)."""
    import numpy as np
    from threadpoolctl import threadpool_info

    np.ones((2, 2)) @ np.ones((2, 2))  # loaded
    found = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    mine = [i for i in found if "numpy" in i.get("filepath", "")]
    return (mine or found or [{}])[0]


def describe_numpy_blas(info: dict[str, Any] | None = None) -> str:
    """e.g. `openblas 0.3.31 Haswell kernels (OPENBLAS_CORETYPE=Haswell)`."""
    info = numpy_blas() if info is None else info
    if not info:
        return "no BLAS found by threadpoolctl"
    text = " ".join(str(info[k]) for k in ("internal_api", "version") if info.get(k))
    if info.get("architecture"):
        text += f" {info['architecture']} kernels"
    forced = os.environ.get(CORETYPE if info.get("internal_api") == "openblas" else MKL_ISA)
    if forced:
        text += f" ({CORETYPE if info.get('internal_api') == 'openblas' else MKL_ISA}={forced})"
    return text


def coretype_mismatch(info: dict[str, Any]) -> str | None:
    """A warning when OpenBLAS runs another kernel set than OPENBLAS_CORETYPE asked for."""
    asked = os.environ.get(CORETYPE)
    got = info.get("architecture")
    if not asked or info.get("internal_api") != "openblas" or got is None:
        return None
    if got.lower() == asked.lower():
        return None
    return f"warning: {CORETYPE}={asked} asked, but OpenBLAS runs its {got} kernels"


def describe_torch_blas(torch: Any) -> str:
    """e.g. `mkl, CPU capability AVX2 (MKL_ENABLE_INSTRUCTIONS=AVX2)`."""
    config = torch.__config__.show()
    blas = next((part.split("=", 1)[1] for part in config.replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "unknown BLAS")
    text = f"{blas}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    forced = os.environ.get(MKL_ISA)
    return text + (f" ({MKL_ISA}={forced})" if forced and blas == "mkl" else "")
