"""A damaged or foreign artifact, a host without the artifact's CPU features, and inputs of the
wrong count, shape or dtype each give a `TilefoldError` naming the problem, before any of the
artifact's code is loaded, never a crash."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tilefold
from tests.aot.graphs import GRAPHS, RNG_SEED, random_inputs
from tilefold.artifact import cpu
from tilefold.artifact.format import DATA, DIGEST, MANIFEST, PROGRAM, digest64
from tilefold.errors import ArtifactError, DTypeError, ShapeError, UnsupportedError
from tilefold.target import named_target


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["views"](rng)
    return tilefold.export(module, random_inputs(module, rng),
                           tmp_path_factory.mktemp("aot") / "views.tfa")


@pytest.fixture
def copy(exported: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(exported, tmp_path / "copy.tfa"))


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def _library(root: Path) -> Path:
    (library,) = root.glob("kernels-*.so")
    return library


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path, where: float = 0.5, bit: int = 0x40) -> None:
    """Flip `bit` of the byte `where` of the way into the file (1.0: its last byte)."""
    data = bytearray(path.read_bytes())
    data[min(int(len(data) * where), len(data) - 1)] ^= bit
    path.write_bytes(bytes(data))


def test_the_pristine_copy_loads(copy: Path) -> None:
    rng = np.random.default_rng(0)
    (x,) = random_inputs(GRAPHS["views"](rng), rng)
    assert len(tilefold.load(copy)(x)) == 2
    assert str(copy) in Path("/proc/self/maps").read_text()  # (what the check above sees)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: (p / MANIFEST).unlink(), "manifest.json: no such file"),
    (lambda p: (p / MANIFEST).write_bytes(b"\x7fELF\x02\x01"), "not valid JSON"),
    (lambda p: (p / MANIFEST).write_text("[1, 2]"), "not a JSON object"),
    (lambda p: _edit_json(p / MANIFEST, lambda m: m.update(format="onnx")),
     "not a tilefold artifact manifest"),
    (lambda p: _edit_json(p / MANIFEST, lambda m: m.update(format_version=99)),
     "format version 99"),
    (lambda p: _edit_json(p / MANIFEST, lambda m: m["parts"].pop("data")),
     "must list the parts"),
    (lambda p: _edit_json(p / MANIFEST, lambda m: m["inputs"][0].update(dtype="bf16")),
     "inputs must each have a dtype"),
    (lambda p: (p / DATA).unlink(), "data.bin: missing"),
    (lambda p: _truncate(p / DATA), "data.bin: truncated"),
    (lambda p: _truncate(_library(p)), r"kernels-\w+\.so: truncated"),
    (lambda p: (p / PROGRAM).write_text((p / PROGRAM).read_text() + " "),
     "program.json: longer than exported"),
    (lambda p: _flip_a_byte(_library(p)), r"kernels-\w+\.so: digest64 differs"),
    (lambda p: _edit_json(p / MANIFEST, lambda m: m["parts"]["library"].update(
        file="../../lib.so")), "must be a file kernels-<16 hex digits>.so"),
    (lambda p: _flip_a_byte(p / DATA), "data.bin: digest64 differs"),
    (lambda p: _flip_a_byte(p / DATA, 0.0, 0x01), "data.bin: digest64 differs"),
    (lambda p: _flip_a_byte(p / DATA, 0.999, 0x80), "data.bin: digest64 differs"),
    (lambda p: _flip_a_byte(p / DATA, 1.0, 0x01), "data.bin: digest64 differs"),
    (lambda p: _flip_a_byte(p / PROGRAM), "program.json: digest64 differs"),
    (lambda p: _flip_a_byte(p / PROGRAM, 1.0, 0x01), "program.json: digest64 differs"),
    (lambda p: _edit_json(p / MANIFEST, lambda m: m.update(format_version=1)),
     "format version 1; tilefold .* reads version 2"),
    (lambda p: _edit_json(p / MANIFEST, lambda m: m["parts"]["data"].pop(DIGEST)),
     "part 'data' lacks its size or digest64"),
], ids=["no-manifest", "binary-manifest", "manifest-not-object", "other-format",
        "other-version", "part-unlisted", "bad-dtype", "no-data", "truncated-data",
        "truncated-library", "longer-program", "altered-library", "library-elsewhere",
        "altered-data-middle", "altered-data-start", "altered-data-near-end",
        "altered-data-last-byte", "altered-program", "altered-program-end",
        "version-1", "no-digest"])
def test_a_damaged_artifact_is_refused(copy: Path, damage, message: str) -> None:
    damage(copy)
    with pytest.raises(ArtifactError, match=message):
        tilefold.load(copy)
    assert str(copy) not in Path("/proc/self/maps").read_text()  # its code never loaded


def test_a_path_that_is_no_artifact_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not an artifact directory"):
        tilefold.load(tmp_path / "nothing")
    (tmp_path / "file.tfa").write_bytes(b"PK\x03\x04")
    with pytest.raises(ArtifactError, match="not an artifact directory"):
        tilefold.load(tmp_path / "file.tfa")


def _reseal(root: Path, part: str, file: str) -> None:
    """Make the manifest's digest of `part` match its file again (a consistent forgery)."""
    data = (root / file).read_bytes()
    _edit_json(root / MANIFEST, lambda m: m["parts"][part].update(
        {"bytes": len(data), DIGEST: digest64(data)}))


def _point_outside(program: dict) -> None:
    program["objects"][0]["at"][1] = 1 << 40


def _negative_buffer(program: dict) -> None:
    program["objects"][0]["at"][0] = -1


def _absolute_address(program: dict) -> None:
    call = next(c for c in program["calls"] if c["signature"][0] == "p")
    call["args"][0] = ["value", 0x7F0000001000]


def _one_argument_less(program: dict) -> None:
    program["calls"][0]["args"].pop()


def _pointer_word_at_the_end(program: dict) -> None:
    program["pointers"][0][0][1] = program["buffers"][program["pointers"][0][0][0]]["bytes"]


@pytest.mark.parametrize("forge", [_point_outside, _negative_buffer, _absolute_address,
                                   _one_argument_less, _pointer_word_at_the_end])
def test_a_step_program_that_points_anywhere_else_is_refused(copy: Path, forge) -> None:
    """Even resealed (the digests made to match), a program whose references leave their
    buffers or do not fit the calls' signatures is refused, never run."""
    _edit_json(copy / PROGRAM, forge)
    _reseal(copy, "program", PROGRAM)
    with pytest.raises(ArtifactError, match="malformed step program"):
        tilefold.load(copy)


def test_a_library_of_another_export_is_refused(copy: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["mlp"](rng)
    other = _library(tilefold.export(module, random_inputs(module, rng), tmp_path / "mlp.tfa"))
    shutil.copy(other, copy / other.name)
    _edit_json(copy / MANIFEST, lambda m: m["parts"]["library"].update(file=other.name))
    _reseal(copy, "library", other.name)
    with pytest.raises(ArtifactError, match="was not exported with"):
        tilefold.load(copy)


def test_a_call_of_a_function_the_library_lacks_is_refused(copy: Path) -> None:
    _edit_json(copy / PROGRAM, lambda p: p["calls"][0].update(symbol="m9.no_such_kernel"))
    _reseal(copy, "program", PROGRAM)
    with pytest.raises(ArtifactError, match=r"no function 'm9\.no_such_kernel'"):
        tilefold.load(copy)


def test_a_host_lacking_a_cpu_feature_is_refused(copy: Path) -> None:
    absent = next((f for f in ("avx512f", "amx-tile", "avx512fp16", "sse4a")
                   if cpu.missing_features([f])), "no-such-feature")
    _edit_json(copy / MANIFEST, lambda m: m["target"]["cpu_features"].append(absent))
    with pytest.raises(UnsupportedError, match=f"lacks: {absent}"):
        tilefold.load(copy)


def test_a_feature_the_loader_cannot_check_counts_as_missing() -> None:
    missing = cpu.missing_features(["xsave", "a-feature-from-the-future"])
    assert missing == ["a-feature-from-the-future"]  # xsave: never in generated code


@pytest.mark.parametrize("name", ["x86-64-v3", "x86-64-v4", "znver4", "sapphirerapids"])
def test_every_feature_of_a_named_target_is_checked(name: str) -> None:
    """A named target's artifact is checked completely: no feature left unchecked."""
    flags, unchecked = cpu.cpuinfo_flags(sorted(named_target(name).features))
    assert unchecked == [] and "avx2" in flags


def test_the_manifest_lists_unchecked_features_apart(exported: Path) -> None:
    target = json.loads((exported / MANIFEST).read_text())["target"]
    assert cpu.cpuinfo_flags(target["cpu_features"])[1] == []
    assert target["unchecked_features"] == cpu.cpuinfo_flags(
        sorted(tilefold.host_target().features))[1]


def test_another_architecture_is_refused(copy: Path) -> None:
    _edit_json(copy / MANIFEST, lambda m: m["target"].update(arch="riscv64"))
    with pytest.raises(UnsupportedError, match="exported for riscv64"):
        tilefold.load(copy)


def test_inputs_of_the_wrong_count_shape_or_dtype_are_refused(exported: Path) -> None:
    model = tilefold.load(exported)
    x = np.random.default_rng(3).standard_normal((4, 6, 8)).astype(np.float32)
    with pytest.raises(ShapeError, match=r"takes 1 inputs \(x\), got 2"):
        model(x, x)
    with pytest.raises(ShapeError, match=r"%x must have shape \[4, 6, 8\].*got \[4, 6, 9\]"):
        model(np.zeros((4, 6, 9), np.float32))
    with pytest.raises(DTypeError, match=r"%x must be f32 .* got float64"):
        model(x.astype(np.float64))
    assert len(model(x)) == 2  # and it still runs after the refusals
