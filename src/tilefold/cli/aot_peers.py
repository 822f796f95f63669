"""The deployable artifacts `tilefold bench aot` compares, each built from the same PyTorch
model at the same static shapes: tilefold's (`tilefold.export`), AOTInductor's `.pt2`
(`torch._inductor.aoti_compile_and_package`) and an `.onnx` file for ONNX Runtime; their
sizes, and each loaded in this process for the steady-latency timing. The C driver
(`data/aot/bench_model.c`) is built here too, against the tilefold artifact's library."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefold.artifact.format import DATA
from tilefold.cli.aot_start import LOADERS

TILEFOLD, TILEFOLD_C, JIT, AOTI, ORT = (
    "tilefold artifact", "tilefold artifact (C)", "tilefold JIT", "AOTInductor", "ONNX Runtime")


@dataclass
class Artifact:
    """One contender's artifact: where it is, the loader kind (`aot_start.LOADERS`), how long
    building it took, and its files' bytes."""

    name: str
    kind: str
    path: Path
    build_s: float
    files: dict[str, int] = field(default_factory=dict)

    def total_bytes(self) -> int:
        return sum(self.files.values())

    def code_bytes(self) -> int | None:
        """Bytes beyond the weights and constants the artifact holds, where they can be told
        apart: tilefold's files but data.bin, an ONNX file but its initializers; None for a
        `.pt2`, whose weights are inside its shared library."""
        if self.kind == "tilefold":
            return self.total_bytes() - self.files[DATA]
        if self.kind == "ort":
            import onnx
            from onnx import numpy_helper

            graph = onnx.load(str(self.path)).graph
            return self.total_bytes() - sum(numpy_helper.to_array(t).nbytes
                                            for t in graph.initializer)
        return None

    def load(self, threads: int, arrays: list[np.ndarray]) -> Callable[[], Any]:
        return LOADERS[self.kind](str(self.path), threads, arrays)


def file_sizes(path: Path) -> dict[str, int]:
    """Bytes of `path`, or of each file under it (a directory)."""
    if path.is_file():
        return {path.name: path.stat().st_size}
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*"))
            if p.is_file()}


def weight_bytes(model: Any) -> int:
    """The bytes of the model's parameters and buffers at their own precision (each storage
    once: tied weights count once)."""
    seen: dict[int, int] = {}
    for t in (*model.parameters(), *model.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _timed(name: str, kind: str, path: Path, build: Callable[[], object]) -> Artifact:
    start = time.perf_counter()
    build()
    return Artifact(name, kind, path, time.perf_counter() - start, file_sizes(path))


def build_tilefold(model: Any, inputs: tuple, out: Path) -> Artifact:
    import tilefold

    path = out / "model.tfa"
    return _timed(TILEFOLD, "tilefold", path, lambda: tilefold.export(model, inputs, path))


def build_aoti(model: Any, inputs: tuple, out: Path) -> Artifact:
    import torch

    path = out / "model.pt2"

    def build() -> None:
        with torch.no_grad():
            program = torch.export.export(model, inputs)
            torch._inductor.aoti_compile_and_package(program, package_path=str(path))

    return _timed(AOTI, "aoti", path, build)


def build_onnx(model: Any, inputs: tuple, out: Path) -> Artifact:
    """The TorchScript-based exporter (torch.onnx with dynamo=False needs only the onnx
    package), all weights inside the one file."""
    import torch

    path = out / "model.onnx"

    def build() -> None:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17,
                              input_names=["input_ids", "attention_mask"],
                              output_names=["output"])

    return _timed(ORT, "ort", path, build)


def build_c_driver(artifact: Path, out: Path) -> Path:
    """`bench_model.c` compiled by the system's cc and linked against the artifact's library
    (found through an rpath: no environment needed)."""
    from tilefold.aot.c_abi import source_dir

    compiler = shutil.which("cc")
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc) on PATH")
    (library,) = artifact.glob("kernels-*.so")
    binary = out / "bench_model"
    subprocess.run([compiler, "-O2", f"-I{artifact}", f"-I{source_dir()}",
                    str(source_dir() / "bench_model.c"),
                    "-o", str(binary), str(library), f"-Wl,-rpath,{artifact}"],
                   check=True, capture_output=True, text=True)
    return binary


def c_specs(arrays: list[np.ndarray], outputs: list[np.ndarray], out: Path) -> list[str]:
    """The driver's SIDE:DTYPE:DIMS:FILE arguments (inputs written as raw files)."""
    from tilefold.artifact.format import DTYPES, dtype_name

    def spec(side: str, a: np.ndarray, file: Path) -> str:
        dims = ",".join(map(str, a.shape))
        return f"{side}:{list(DTYPES).index(dtype_name(a.dtype))}:{dims}:{file}"

    specs = []
    for i, a in enumerate(arrays):
        np.ascontiguousarray(a).tofile(out / f"in{i}.bin")
        specs.append(spec("i", a, out / f"in{i}.bin"))
    return specs + [spec("o", y, Path(os.devnull)) for y in outputs]
