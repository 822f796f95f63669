"""An exported artifact, loaded, computes bit for bit what the in-process compiled graph
computes on the same host, for every input it is given (random, not zeros or ones)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import tilefold
from tests.aot.graphs import GRAPHS, RNG_SEED, random_inputs
from tilefold.aot.c_abi import HEADER_FILE
from tilefold.artifact.format import DATA, DIGEST, MANIFEST, PROGRAM, digest64
from tilefold.cli.main import main
from tilefold.errors import ArtifactError, UnsupportedError
from tilefold.target import named_target


def _exported(name: str, tmp_path, target: str | None = None):
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS[name](rng)
    path = tilefold.export(module, random_inputs(module, rng), tmp_path / f"{name}.tfa",
                           target=target)
    return module, path, rng


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_loaded_artifact_matches_the_compiled_graph_bit_for_bit(name: str, tmp_path) -> None:
    module, path, rng = _exported(name, tmp_path)
    names = {p.name for p in path.iterdir()}
    (library,) = [n for n in names if re.fullmatch(r"kernels-[0-9a-f]{16}\.so", n)]
    assert names - {library} == {DATA, MANIFEST, PROGRAM, HEADER_FILE}
    loaded = tilefold.load(path)
    compiled = tilefold.compile(module)
    previous = None
    for _ in range(2):  # inputs other than the exporter's, twice: each call reads its inputs
        inputs = random_inputs(module, rng)
        got, want = loaded(*inputs), compiled(*inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert g.tobytes() == w.tobytes()
        if previous is not None:
            assert not np.array_equal(got[0], previous)
        previous = got[0]
    want = tilefold.interpret(module, *inputs)  # and it is the graph's meaning, not noise
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_the_manifest_describes_inputs_outputs_and_target(tmp_path) -> None:
    _, path, _ = _exported("norms", tmp_path)
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["inputs"] == [{"name": "x", "dtype": "f32", "shape": [6, 40]},
                                  {"name": "r", "dtype": "f32", "shape": [6, 40]}]
    assert [o["shape"] for o in manifest["outputs"]] == [[6, 40], [6, 40]]
    assert manifest["tilefold_version"] == tilefold.__version__
    assert set(tilefold.host_target().features) <= set(manifest["target"]["cpu_features"])
    assert set(manifest["parts"]) == {"library", "program", "data"}
    # the layer_norm's gain and shift are constants: their bytes are in the data file
    data = (path / DATA).read_bytes()
    constants = [op.attrs["value"] for op in GRAPHS["norms"](np.random.default_rng(RNG_SEED))
                 ["main"].ops if op.name == "constant"]
    assert len(constants) == 2 and all(c.tobytes() in data for c in constants)


def test_the_data_file_holds_the_weights_once_and_no_workspace(tmp_path) -> None:
    """The GEMMs read their weights packed: the packed copies are saved, not the originals
    as well, nor the GEMMs' packing workspaces (scratch, allocated at load)."""
    module, path, _ = _exported("mlp", tmp_path)
    weights = sum(op.attrs["value"].nbytes for op in module["main"].ops
                  if op.name == "constant")
    assert weights <= (path / DATA).stat().st_size <= weights + 4096


def test_the_weights_come_from_the_data_file(tmp_path) -> None:
    """Double the layer_norm's gain in data.bin (digest resealed): the loaded model follows,
    y = n * g + b becoming n * 2g + b = 2y - b."""
    module, path, rng = _exported("norms", tmp_path)
    inputs = random_inputs(module, rng)
    before = tilefold.load(path)(*inputs)[1]
    gain, shift = (op.attrs["value"] for op in module["main"].ops if op.name == "constant")
    data = (path / DATA).read_bytes()
    assert data.count(gain.tobytes()) == 1
    data = data.replace(gain.tobytes(), (2 * gain).tobytes())
    (path / DATA).write_bytes(data)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["parts"]["data"][DIGEST] = digest64(data)
    (path / MANIFEST).write_text(json.dumps(manifest))
    after = tilefold.load(path)(*inputs)[1]
    np.testing.assert_allclose(after, 2 * before - shift, rtol=1e-5, atol=1e-5)
    assert not np.allclose(after, before)


def test_outputs_are_fresh_arrays_the_caller_owns(tmp_path) -> None:
    module, path, rng = _exported("mlp", tmp_path)
    loaded = tilefold.load(path)
    inputs = random_inputs(module, rng)
    first = loaded(*inputs)[0]
    kept = first.copy()
    loaded(*random_inputs(module, rng))
    assert first.tobytes() == kept.tobytes()


@pytest.mark.parametrize("name", ["mlp", "views"])
def test_a_named_target_is_exported_for_that_target(name: str, tmp_path) -> None:
    """Every module is compiled for the named target, the native copy (built for the host in
    process: its IR assumes no CPU feature) included: the artifact needs no more of a host."""
    module, path, rng = _exported(name, tmp_path, target="x86-64-v3")
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["target"]["name"] == "x86-64-v3"
    assert set(manifest["target"]["cpu_features"]) == set(named_target("x86-64-v3").features)
    inputs = random_inputs(module, rng)
    got = tilefold.load(path)(*inputs)
    want = tilefold.compile(module, "x86-64-v3")(*inputs)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))


def test_a_target_this_host_cannot_run_is_refused(tmp_path) -> None:
    module = GRAPHS["mlp"](np.random.default_rng(RNG_SEED))
    absent = next(t for t in ("x86-64-v4", "sapphirerapids", "neoverse-v1")
                   if not named_target(t).is_host())
    inputs = random_inputs(module, np.random.default_rng(0))
    with pytest.raises(ArtifactError, match=f"cannot export for {absent} on this host"):
        tilefold.export(module, inputs, tmp_path / "out.tfa", target=absent)


def test_only_a_tilefold_module_is_exported(tmp_path) -> None:
    with pytest.raises(UnsupportedError, match=r"a torch\.nn\.Module or a torch\.export "
                       "ExportedProgram, not a object"):
        tilefold.export(object(), [], tmp_path / "out.tfa")


def test_exporting_again_to_a_loaded_path_loads_the_new_artifact(tmp_path) -> None:
    """dlopen hands back a library already loaded under the same name: each export names its
    library afresh, so the second load runs the second graph's kernels."""
    rng = np.random.default_rng(RNG_SEED)
    first = GRAPHS["mlp"](rng)
    b = tilefold.Builder()
    x = b.arg("x", "f32", (8, 64))
    second = b.build(b.op("tanh", x @ b.constant(rng.standard_normal((64, 16), np.float32))))
    inputs = random_inputs(first, rng)
    for module in (first, second):
        tilefold.export(module, inputs, tmp_path / "model.tfa")
        got = tilefold.load(tmp_path / "model.tfa")(*inputs)
        assert got[0].tobytes() == tilefold.compile(module)(*inputs)[0].tobytes()


def test_the_command_line_exports_a_tfir_file(tmp_path, capsys) -> None:
    module = GRAPHS["mlp"](np.random.default_rng(RNG_SEED))
    source = tmp_path / "mlp.tfir"
    source.write_text(tilefold.print_module(module))
    out = tmp_path / "mlp.tfa"
    assert main(["export", str(source), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    inputs = random_inputs(module, np.random.default_rng(1))
    got = tilefold.load(out)(*inputs)
    assert got[0].tobytes() == tilefold.compile(module)(*inputs)[0].tobytes()


def test_the_command_line_asks_for_every_symbolic_dim(tmp_path, capsys) -> None:
    source = tmp_path / "dyn.tfir"
    source.write_text("module {\n  func @main(%x: f32[?n,8]) -> (f32[?n,8]) {\n"
                      "    %0 = exp(%x) : f32[?n,8]\n    return(%0)\n  }\n}\n")
    assert main(["export", str(source), "-o", str(tmp_path / "out")]) == 1
    assert "--bind n=SIZE" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["export", str(source), "-o", str(tmp_path / "out"), "--bind", "n=3"]) == 0
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    want = tilefold.compile(tilefold.parse_file(source))(x)[0]
    assert tilefold.load(tmp_path / "out")(x)[0].tobytes() == want.tobytes()
