"""The C ABI: a C program compiled by the system's cc against an artifact's library and header
runs the model with no Python in it, and gets bit for bit what `tilefold.compile` gets; a
damaged data file or inputs of the wrong shape are error codes with messages, not crashes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tilefold
from tests.aot.graphs import GRAPHS, RNG_SEED, random_inputs
from tilefold.aot.c_abi import source_dir
from tilefold.artifact.format import DATA, DTYPES, dtype_name

PROGRAM = Path(__file__).with_name("run_model.c")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The views graph exported (a GEMM, kernel-IR groups, a native copy, a strided output),
    and the C program linked against its library."""
    tmp = tmp_path_factory.mktemp("c_abi")
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["views"](rng)
    path = tilefold.export(module, random_inputs(module, rng), tmp / "views.tfa")
    (library,) = path.glob("kernels-*.so")
    return module, path, _build(path, library, tmp / "run_model")


def _build(path: Path, library: Path, binary: Path) -> Path:
    """The C program linked against `library` of the artifact `path`."""
    subprocess.run([shutil.which("cc"), "-O1", "-Wall", "-Werror", f"-I{path}",
                    f"-I{source_dir()}", str(PROGRAM), "-o", str(binary), str(library),
                    f"-Wl,-rpath,{path}"], check=True)  # source_dir: tensor_args.h
    return binary


def _spec(side: str, array: np.ndarray, file: Path) -> str:
    dims = ",".join(map(str, array.shape)) or "-"
    return f"{side}:{list(DTYPES).index(dtype_name(array.dtype))}:{dims}:{file}"


def _run(binary: Path, artifact: Path, inputs, outputs, tmp: Path) -> str:
    specs = []
    for i, x in enumerate(inputs):
        x.tofile(tmp / f"in{i}.bin")
        specs.append(_spec("i", x, tmp / f"in{i}.bin"))
    specs += [_spec("o", y, tmp / f"out{i}.bin") for i, y in enumerate(outputs)]
    done = subprocess.run([str(binary), str(artifact), *specs], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_c_program_runs_the_model_bit_for_bit(built, tmp_path: Path) -> None:
    module, path, binary = built
    inputs = random_inputs(module, np.random.default_rng(5))
    _runs_bit_for_bit(binary, path, inputs, tilefold.compile(module)(*inputs), tmp_path)


def _runs_bit_for_bit(binary: Path, path: Path, inputs, want, tmp_path: Path) -> None:
    assert _run(binary, path, inputs, want, tmp_path) == "ok"
    for i, w in enumerate(want):
        got = np.fromfile(tmp_path / f"out{i}.bin", w.dtype).reshape(w.shape)
        assert got.tobytes() == np.ascontiguousarray(w).tobytes()


@pytest.mark.parametrize("where", [0.0, 0.5, 0.999, 1.0],
                         ids=["first-byte", "middle", "near-end", "last-byte"])
def test_an_altered_byte_of_data_is_an_error_code(built, tmp_path: Path, where: float) -> None:
    module, path, binary = built
    copy = Path(shutil.copytree(path, tmp_path / "copy.tfa"))
    inputs = random_inputs(module, np.random.default_rng(5))
    outputs = tilefold.compile(module)(*inputs)
    data = bytearray((copy / DATA).read_bytes())
    data[min(int(len(data) * where), len(data) - 1)] ^= 0x10
    (copy / DATA).write_bytes(bytes(data))
    said = _run(binary, copy, inputs, outputs, tmp_path)
    assert said.startswith("load 2 ") and "digest64 differs" in said, said


def test_a_damaged_data_file_is_an_error_code(built, tmp_path: Path) -> None:
    module, path, binary = built
    copy = Path(shutil.copytree(path, tmp_path / "copy.tfa"))
    inputs = random_inputs(module, np.random.default_rng(5))
    outputs = tilefold.compile(module)(*inputs)
    data = bytearray((copy / DATA).read_bytes())
    (copy / DATA).write_bytes(bytes(data[:-8]))
    said = _run(binary, copy, inputs, outputs, tmp_path)
    assert said.startswith("load 2 ") and "the library was exported with" in said, said
    (copy / DATA).unlink()
    assert _run(binary, copy, inputs, outputs, tmp_path).startswith("load 1 ")


def test_inputs_of_the_wrong_shape_or_dtype_are_an_error_code(built, tmp_path: Path) -> None:
    module, path, binary = built
    (x,) = random_inputs(module, np.random.default_rng(5))
    outputs = tilefold.compile(module)(x)
    wrong_shape = np.zeros((4, 6, 9), np.float32)
    said = _run(binary, path, [wrong_shape], outputs, tmp_path)
    assert said.startswith("run 4 input 0: dim 2 is 9"), said
    assert _run(binary, path, [x.astype(np.float64)], outputs, tmp_path).startswith(
        "run 4 input 0: dtype")
    assert _run(binary, path, [x, x], outputs, tmp_path).startswith("run 4 the model takes")


@pytest.mark.parametrize(("argument", "code"), [
    ("i:3:4,6,8", 2), ("x:1:4,6,8:f", 2), ("i:9:4,6,8:f", 2), ("i:1:1,2,3,4,5,6,7,8,9:f", 2),
    ("i:1:4,6,8:/no/such/file", 3)], ids=["no-file", "side", "dtype", "rank", "unreadable"])
def test_a_malformed_tensor_argument_is_refused(built, argument: str, code: int) -> None:
    """The drivers' shared parser (data/aot/tensor_args.h) refuses, never crashes."""
    _, path, binary = built
    done = subprocess.run([str(binary), str(path), argument], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == code and done.stdout == "", (done.returncode, done.stdout)


def test_export_c_writes_a_smaller_library_for_c_alone(tmp_path: Path, capsys) -> None:
    """`tilefold export --c`: libtilefold_model.so beside the artifact's parts, exporting the
    header's four functions only, smaller than the kernels library, running the model from
    C bit for bit (and a damaged data file still an error code); the Python loader is
    unchanged."""
    from tilefold.aot.link import C_ABI
    from tilefold.cli.main import main

    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["views"](rng)
    (tmp_path / "views.tfir").write_text(tilefold.print_module(module))
    path = tmp_path / "views.tfa"
    assert main(["export", str(tmp_path / "views.tfir"), "-o", str(path), "--c"]) == 0
    capsys.readouterr()
    library, (kernels,) = path / "libtilefold_model.so", path.glob("kernels-*.so")
    assert library.stat().st_size < kernels.stat().st_size
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True,
                             text=True, check=True).stdout.split()
    assert sorted(symbols[2::3]) == sorted(C_ABI)
    binary = _build(path, library, tmp_path / "run_model")
    inputs = random_inputs(module, np.random.default_rng(5))
    want = tilefold.compile(module)(*inputs)
    _runs_bit_for_bit(binary, path, inputs, want, tmp_path)
    assert all(g.tobytes() == np.ascontiguousarray(w).tobytes()
               for g, w in zip(tilefold.load(path)(*inputs), want, strict=True))
    (path / DATA).write_bytes((path / DATA).read_bytes()[:-8])
    assert _run(binary, path, inputs, want, tmp_path).startswith("load 2 ")
