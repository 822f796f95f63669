"""GEMM module fingerprints are the same in every process, whatever Python's hash seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tilefold

_PRINT = """
from tilefold.codegen.llvm.gemm.module import _fingerprint, _kernel_params
from tilefold.codegen.llvm.gemm.registry import MICROKERNELS
for kernel in MICROKERNELS:
    print(_fingerprint("gemm", **_kernel_params(kernel)))
"""


def test_fingerprints_do_not_depend_on_the_hash_seed():
    """A kernel's feature set once printed in hash order, so a warm process (another seed)
    missed the kernel cache and ran LLVM again."""
    src = str(Path(tilefold.__file__).parents[1])
    outputs = set()
    for seed in ("1", "2", "3", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", _PRINT], env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout
        assert out.count("\n") >= 4
        outputs.add(out)
    assert len(outputs) == 1
