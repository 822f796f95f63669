"""`tilefold.load` runs an artifact in a fresh process that imports NumPy and ctypes and no
LLVM, PyTorch or ml_dtypes (nor, beyond NumPy's imports, modules slow to import that loading
does not need), and gets what the exporting process's compiled graph got."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import tilefold
from tests.aot.graphs import GRAPHS, RNG_SEED, random_inputs

_CHILD = """
import sys
import numpy as np
before = set(sys.modules)
import tilefold
model = tilefold.load(sys.argv[1])
outputs = model(*[np.load(p) for p in sys.argv[3:]])
for i, out in enumerate(outputs):
    np.save(f"{sys.argv[2]}/out{i}.npy", out)
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"llvmlite", "torch", "ml_dtypes"})
compiler = sorted(m for m in sys.modules if m.startswith("tilefold.")
                  and not m.startswith(("tilefold.artifact", "tilefold.errors",
                                        "tilefold.version")))
print("imported:", heavy, compiler)
slow = sorted((set(sys.modules) - before) & {"pathlib", "threading", "hashlib", "urllib.parse",
                                             "statistics", "random", "inspect"})
print("slow to import:", slow)
"""


def run_fresh(path: Path, inputs: list[np.ndarray], tmp_path: Path) -> tuple[str, list]:
    """Load and run the artifact at `path` on `inputs` in a new Python process: what it says it
    imported, and its outputs."""
    files = []
    for i, x in enumerate(inputs):
        files.append(str(tmp_path / f"in{i}.npy"))
        np.save(files[-1], x)
    src = str(Path(tilefold.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tmp_path), *files],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    outputs = sorted(tmp_path.glob("out*.npy"), key=lambda p: int(p.stem[3:]))
    return done.stdout, [np.load(p) for p in outputs]


def test_a_new_process_runs_the_artifact_without_llvm_or_torch(tmp_path: Path) -> None:
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["mlp"](rng)
    path = tilefold.export(module, random_inputs(module, rng), tmp_path / "mlp.tfa")
    inputs = random_inputs(module, rng)
    said, got = run_fresh(path, inputs, tmp_path)
    assert "imported: [] []" in said, said
    # Start-up time: beyond NumPy's, the loader imports what loading needs (json, mmap,
    # ctypes), not these (each a few ms of a new process's first result).
    assert "slow to import: []" in said, said
    want = tilefold.compile(module)(*inputs)
    assert len(got) == len(want)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))
