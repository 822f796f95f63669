"""Symbolic-shape artifacts (`dynamic_shapes=`): one artifact serves every size of a symbolic
dim within its bounds, bit for bit what `tilefold.compile` gives at that size; sizes outside
the bounds, wrong ranks and dtypes are refused with TilefoldErrors; the manifest lists the
dim, its bounds and the size classes; a C program runs such an artifact as the Python loader
does, and refuses sizes outside its bounds with an error code and a message."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tilefold
from tilefold import Builder, Module
from tilefold.aot.c_abi import source_dir
from tilefold.artifact.format import DIGEST, DTYPES, MANIFEST, PROGRAM, digest64
from tilefold.errors import ArtifactError, DTypeError, ShapeError, TilefoldError
from tilefold.ir.types import SymDim

BOUND = 80
RUN_MODEL = Path(__file__).with_name("run_model.c")


def block(rng: np.random.Generator) -> Module:
    """An MLP (GEMM + bias + gelu, GEMM + bias), a residual layer_norm and a softmax over
    rows of a symbolic count ?s: a GEMV at one row, a GEMM beyond."""
    def w(shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    b = Builder()
    x, r = b.arg("x", "f32", ("?s", 64)), b.arg("r", "f32", ("?s", 64))
    h = b.op("gelu", x @ b.constant(w((64, 96))) + b.constant(w((96,))))
    y = h @ b.constant(w((96, 64))) + b.constant(w((64,)))
    y = b.op("layer_norm", y + r, b.constant(w((64,)) + 1), b.constant(w((64,))), eps=1e-5)
    return b.build(b.op("softmax", y), y)


def llama_block(rng: np.random.Generator, d: int = 64, heads: int = 4, f: int = 128
                ) -> Module:
    """A LLaMA-style layer over ?s tokens: rms_norm, Q/K/V, `heads` heads of causal
    attention (a kernel reading dims and strides from array headers), the output projection
    and a residual, rms_norm, a SwiGLU MLP and a residual (MiniLM's shape: 384, 12, 1536)."""
    def w(shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    s = SymDim("s")
    b = Builder()
    x = b.arg("x", "f32", ("?s", d))

    def split(t):
        return b.op("transpose", b.op("reshape", t, shape=(1, s, heads, d // heads)),
                    perm=(0, 2, 1, 3))
    n1 = b.op("rms_norm", x, b.constant(w((d,)) + 1), eps=1e-5)
    q, k, v = (split(n1 @ b.constant(w((d, d)))) for _ in range(3))
    a = b.op("scaled_dot_product_attention", q, k, v, is_causal=True)
    h = x + b.op("reshape", b.op("transpose", a, perm=(0, 2, 1, 3)), shape=(s, d)) \
        @ b.constant(w((d, d)))
    n2 = b.op("rms_norm", h, b.constant(w((d,)) + 1), eps=1e-5)
    g = b.op("silu", n2 @ b.constant(w((d, f)))) * (n2 @ b.constant(w((d, f))))
    return b.build(h + g @ b.constant(w((f, d))))


def inputs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 64)).astype(np.float32) for _ in range(2)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    module = block(np.random.default_rng(36))
    path = tilefold.export(module, inputs(5), tmp_path_factory.mktemp("sym") / "block.tfa",
                           dynamic_shapes={"s": (1, BOUND)})
    return module, path


def test_every_class_and_the_named_sizes_are_bit_identical(exported) -> None:
    module, path = exported
    model, graph = tilefold.load(path), tilefold.compile(module)
    classes = json.loads((path / MANIFEST).read_text())["size_classes"]
    assert len(classes) >= 2  # one row (GEMV) and more (GEMM) at least
    sizes = [1, 7, 64, BOUND, 7, 1] + [n for lo, hi in classes for n in (lo, (lo + hi) // 2, hi)]
    for i, n in enumerate(sizes):  # back and forth: a class's program bound again per size
        xs = inputs(n, seed=i)
        got, want = model(*xs), graph(*xs)
        assert [g.shape for g in got] == [(n, 64), (n, 64)]
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w), n


def test_a_llama_style_block_at_every_size(tmp_path) -> None:
    module = llama_block(np.random.default_rng(3))
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    path = tilefold.export(module, [x], tmp_path / "llama.tfa", dynamic_shapes={"s": (1, 24)})
    model, graph = tilefold.load(path), tilefold.compile(module)
    assert len(json.loads((path / MANIFEST).read_text())["size_classes"]) >= 2
    for n in [*range(1, 25), 9, 1]:
        x = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
        (got,), (want,) = model(x), graph(x)
        assert got.shape == (n, 64) and np.array_equal(got, want), n
    # and from C (headers that attention reads, per size), every size in one process
    sizes = [*range(1, 25), 9, 1]
    groups = [[np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)]
              for n in sizes]
    said, got = _run_c(c_program(path, tmp_path), path, groups, 1, tmp_path)
    assert said == "ok"
    for n, (x,), (g,) in zip(sizes, groups, got, strict=True):
        assert g.tobytes() == model(x)[0].tobytes(), n


def test_the_manifest_lists_the_symbolic_dim_and_its_bounds(exported) -> None:
    _, path = exported
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["symbols"] == {"s": {"min": 1, "max": BOUND}}
    assert [s["shape"] for s in manifest["inputs"]] == [["?s", 64], ["?s", 64]]
    assert [s["shape"] for s in manifest["outputs"]] == [["?s", 64], ["?s", 64]]
    classes = manifest["size_classes"]
    assert classes[0][0] == 1 and classes[-1][1] == BOUND
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(classes))
    program = json.loads((path / PROGRAM).read_text())
    assert [[c["lo"], c["hi"]] for c in program["classes"]] == classes


def test_sizes_outside_the_bounds_and_bad_inputs_are_refused(exported, tmp_path) -> None:
    module, path = exported
    model = tilefold.load(path)
    with pytest.raises(ShapeError, match=r"\?s = 81 is not a size .*\(1 to 80\)"):
        model(*inputs(BOUND + 1))
    with pytest.raises(ShapeError, match="rank 2"):
        model(np.zeros((4, 64, 1), np.float32), np.zeros((4, 64), np.float32))
    with pytest.raises(DTypeError, match="must be f32"):
        model(np.zeros((4, 64), np.float64), np.zeros((4, 64), np.float32))
    with pytest.raises(ShapeError, match="must have shape"):
        model(np.zeros((4, 63), np.float32), np.zeros((4, 63), np.float32))
    with pytest.raises(ShapeError, match=r"\?s is 4 in one input and 5"):
        model(np.zeros((4, 64), np.float32), np.zeros((5, 64), np.float32))
    with pytest.raises(ShapeError, match="takes 2 inputs"):
        model(np.zeros((4, 64), np.float32))
    small = tilefold.export(module, inputs(4), tmp_path / "small.tfa",
                            dynamic_shapes={"s": (3, 6)})
    loaded = tilefold.load(small)
    with pytest.raises(ShapeError, match=r"\?s = 2 is not a size .*\(3 to 6\)"):
        loaded(*inputs(2))
    for n in (3, 6):
        want = tilefold.compile(module)(*inputs(n))
        assert all(np.array_equal(g, w) for g, w in zip(loaded(*inputs(n)), want,
                                                        strict=True))


@pytest.mark.parametrize("dynamic, message", [
    ({"t": (1, 8)}, r"names \?t, which no argument"),
    ({"s": (0, 8)}, "1 <= min <= max"),
    ({"s": (9, 8)}, "1 <= min <= max"),
    ({"s": "big"}, r"must be \(min, max\)"),
    ({"s": (1, 8), "u": (1, 2)}, r"names \?u, which no argument"),
    ({}, "must name symbolic dims"),
])
def test_bad_dynamic_shapes_are_refused(dynamic, message, tmp_path) -> None:
    module = block(np.random.default_rng(1))
    with pytest.raises(TilefoldError, match=message):
        tilefold.export(module, inputs(4), tmp_path / "bad.tfa", dynamic_shapes=dynamic)
    assert not (tmp_path / "bad.tfa").exists()


def test_the_cli_exports_a_symbolic_dim(tmp_path, capsys) -> None:
    from tilefold.cli.main import main

    module = block(np.random.default_rng(2))
    (tmp_path / "block.tfir").write_text(tilefold.print_module(module))
    out = tmp_path / "cli.tfa"
    assert main(["export", str(tmp_path / "block.tfir"), "-o", str(out),
                 "--dynamic", "s=1:9"]) == 0
    model, graph = tilefold.load(out), tilefold.compile(tilefold.parse_file(
        str(tmp_path / "block.tfir")))
    for n in (1, 2, 9):
        assert all(np.array_equal(g, w) for g, w in
                   zip(model(*inputs(n)), graph(*inputs(n)), strict=True))
    capsys.readouterr()
    assert main(["export", str(tmp_path / "block.tfir"), "-o", str(out),
                 "--dynamic", "s=1-9"]) == 1
    assert "DIM=MIN:MAX" in capsys.readouterr().err


def c_program(path: Path, tmp_path: Path, library: str | None = None) -> Path:
    """tests/aot/run_model.c compiled against the artifact's library (`library`: that file
    of the artifact's, one of a chain's)."""
    (library,) = path.glob(library or "kernels-*.so")
    binary = tmp_path / "run_model"
    subprocess.run([shutil.which("cc"), "-O1", "-Wall", "-Werror", f"-I{path}",
                    f"-I{source_dir()}", str(RUN_MODEL), "-o", str(binary), str(library),
                    f"-Wl,-rpath,{path}"], check=True)
    return binary


def _run_c(binary: Path, path: Path, groups: list[list[np.ndarray]], outputs: int,
           tmp_path: Path) -> tuple[str, list[list[np.ndarray]]]:
    """Run the C program once over every group of inputs in turn (one loaded model); its
    output line and each group's outputs (rows x 64, f32)."""
    argv, files = [], []
    for g, xs in enumerate(groups):
        argv += ["--"] if g else []
        for i, x in enumerate(xs):
            x.tofile(tmp_path / f"in{g}-{i}.bin")
            dims = ",".join(map(str, x.shape))
            argv.append(f"i:{list(DTYPES).index('f32')}:{dims}:{tmp_path / f'in{g}-{i}.bin'}")
        files.append([tmp_path / f"out{g}-{i}.bin" for i in range(outputs)])
        argv += [f"o:{list(DTYPES).index('f32')}:{len(xs[0])},64:{f}" for f in files[-1]]
    done = subprocess.run([str(binary), str(path), *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = [[np.fromfile(f, np.float32).reshape(-1, 64) if f.exists() else None for f in fs]
           for fs in files]
    return done.stdout.strip(), got


def test_a_c_program_runs_every_class_as_the_python_loader_does(exported, tmp_path) -> None:
    """The C runtime of a symbolic artifact (data/aot/runtime_symbolic.c): sizes of every
    class, back and forth in one process (each class's program bound again per size), bit
    for bit what tilefold.load gives."""
    _, path = exported
    binary = c_program(path, tmp_path)
    model = tilefold.load(path)
    classes = json.loads((path / MANIFEST).read_text())["size_classes"]
    sizes = [1, 7, BOUND, 2, 1] + [n for lo, hi in classes for n in (lo, (lo + hi) // 2, hi)]
    groups = [inputs(n, seed=i) for i, n in enumerate(sizes)]
    said, got = _run_c(binary, path, groups, 2, tmp_path)
    assert said == "ok"
    for n, xs, outs in zip(sizes, groups, got, strict=True):
        for g, w in zip(outs, model(*xs), strict=True):
            assert g.shape == (n, 64) and g.tobytes() == w.tobytes(), n


@pytest.mark.parametrize(("shapes", "message"), [
    ([(BOUND + 1, 64), (BOUND + 1, 64)], f"run 4 ?s = {BOUND + 1} is outside the sizes this "
                                         f"artifact was exported for (1 to {BOUND})"),
    ([(4, 64), (5, 64)], "run 4 ?s is 4 in one input and 5 in input 1"),
    ([(4, 64), (4, 63)], "run 4 input 1: dim 1 is 63, the model takes 64 at ?s = 4"),
    ([(4, 64, 1), (4, 64)], "run 4 input 0: rank 2 expected (got 3)")],
    ids=["over-the-bound", "disagreeing", "static-dim", "rank"])
def test_the_c_runtime_refuses_sizes_it_was_not_exported_for(exported, tmp_path, shapes,
                                                             message) -> None:
    _, path = exported
    binary = c_program(path, tmp_path)
    xs = [np.zeros(s, np.float32) for s in shapes]
    said, _ = _run_c(binary, path, [xs], 2, tmp_path)
    assert said == message


def _gap(program: dict) -> None:
    program["classes"][1]["lo"] += 1


def _bounds(program: dict) -> None:
    program["max"] += 1


def _short_table(program: dict) -> None:
    patches = program["classes"][-1]["program"]["patches"]
    table = next(p[2]["t"] for p in patches if isinstance(p[2], dict) and "t" in p[2])
    table.pop()


def _patch_outside(program: dict) -> None:
    program["classes"][-1]["program"]["patches"].append([0, 1 << 40, 1])


def _held_at(program: dict) -> None:  # a class holding another symbol the manifest lacks
    program["outer"] = ["u"]
    for c in program["classes"]:
        c["at"] = [1]


@pytest.mark.parametrize("forge", [_gap, _bounds, _short_table, _patch_outside, _held_at])
def test_a_forged_symbolic_program_is_refused(exported, tmp_path, forge) -> None:
    """Resealed (digests made to match), a program whose classes do not cover the bounds
    once each, or whose values or patches reach outside, is refused at load."""
    _, path = exported
    copy = Path(shutil.copytree(path, tmp_path / "copy.tfa"))
    program = json.loads((copy / PROGRAM).read_text())
    forge(program)
    (copy / PROGRAM).write_text(json.dumps(program))
    data = (copy / PROGRAM).read_bytes()
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["parts"]["program"].update({"bytes": len(data), DIGEST: digest64(data)})
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="malformed step program"):
        tilefold.load(copy)
