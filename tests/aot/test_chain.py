"""An artifact for a chain of targets (`targets=["znver4", "x86-64-v3"]`, `--targets`): one
library per target, the same program and data.bin; both loaders run the first target whose
CPU features the host has and refuse clearly when it has none.

Meaningful on either kind of host: which member a host picks is tested for both kinds by
handing the loader's picking an AVX-512 host's and an AVX2 host's /proc/cpuinfo flags
(`_pick_target(..., flags)`: it only picks, nothing runs); what runs is this host's pick. On
an AVX2 host (or an AVX-512 one without znver4's sse4a: Intel's) the AVX-512 member is only
ever refused (its code never runs) and the x86-64-v3 member runs bit for bit as the graph
compiled for x86-64-v3 does; on a znver4 host the znver4 member runs. From C: a program
linked against the znver4 library, whose tf_model_load keeps the model or hands it to the
x86-64-v3 library (TILEFOLD_ARTIFACT_TARGET forces the hand-over on any host)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tilefold
from tests.aot.test_symbolic import c_program, llama_block
from tilefold.artifact.cpu import cpuinfo_flags, missing_features
from tilefold.artifact.format import DTYPES, MANIFEST
from tilefold.artifact.load import _pick_target
from tilefold.errors import ArtifactError, UnsupportedError
from tilefold.target import host_target, named_target

CHAIN = ["znver4", "x86-64-v3"]
ROWS, D = 8, 384  # MiniLM's width, heads and MLP (384, 12, 1536)
STRONG = named_target("znver4").is_host()  # this host runs the chain's AVX-512 member
PICKED = CHAIN[0] if STRONG else CHAIN[1]

pytestmark = pytest.mark.skipif(not named_target("x86-64-v3").is_host(),
                                reason="the chain's last target needs an AVX2 host")


def host_flags_of(name: str) -> frozenset[str]:
    """The /proc/cpuinfo flags of a host that has exactly the named target's features."""
    return frozenset(["lm", *cpuinfo_flags(sorted(named_target(name).features))[0]])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    module = llama_block(np.random.default_rng(36), d=D, heads=12, f=4 * D)
    x = np.random.default_rng(0).standard_normal((ROWS, D)).astype(np.float32)
    path = tilefold.export(module, [x], tmp_path_factory.mktemp("chain") / "block.tfa",
                           targets=CHAIN)
    return module, path


def test_the_manifest_lists_each_target_and_what_it_runs(exported) -> None:
    _, path = exported
    manifest = json.loads((path / MANIFEST).read_text())
    chain = manifest["targets"]
    assert [t["name"] for t in chain] == CHAIN
    files = [t["library"]["file"] for t in chain]
    assert len(set(files)) == 2 and all((path / f).is_file() for f in files)
    assert [(t["program"]["file"], t["data"]["file"], t["plan"]) for t in chain] == [
        *([("program-0.json", "data-0.bin", "znver4")] if STRONG else
          [("program.json", "data.bin", "x86-64-v3")]), ("program.json", "data.bin", "x86-64-v3")]
    assert manifest["parts"]["library"] == chain[0]["library"]
    assert manifest["target"]["name"] == "znver4"
    gemms = [[k for k in t["kernels"] if k.startswith("gemm_")] for t in chain]
    assert gemms[1] and all(k.startswith("gemm_avx2_") for k in gemms[1])
    if STRONG:  # its own plan: AVX-512 micro-kernels (register tiles, panels of its own)
        assert gemms[0] and all(k.startswith("gemm_avx512") for k in gemms[0]), gemms
    else:  # the x86-64-v3 plan's kernels, compiled for znver4
        assert chain[0]["kernels"] == chain[1]["kernels"]
    assert "avx512f" in chain[0]["cpu_features"] and "avx512f" not in chain[1]["cpu_features"]


def test_each_kind_of_host_picks_its_member(exported) -> None:
    """With an AVX-512 (znver4) host's flags the stronger member is picked, its library the
    part checked; with an AVX2 host's (or an AVX-512 host's lacking znver4's sse4a) the
    weaker; an artifact for the AVX-512 member alone is refused on AVX2, naming what the
    host lacks, and picked on AVX-512."""
    _, path = exported
    manifest = json.loads((path / MANIFEST).read_text())
    chain = manifest["targets"]
    for host, want in (("znver4", 0), ("x86-64-v3", 1), ("x86-64-v4", 1),
                       ("sapphirerapids", 1)):
        picked = _pick_target(path, manifest, None, host_flags_of(host))
        assert picked["target"]["name"] == CHAIN[want], host
        assert picked["parts"]["library"] == chain[want]["library"]
    assert _pick_target(path, manifest, None)["target"]["name"] == PICKED  # this host's flags
    only = {**manifest, "targets": chain[:1]}
    assert _pick_target(path, only, None, host_flags_of("znver4"))["target"]["name"] == "znver4"
    for host in ("x86-64-v3", "x86-64-v4"):
        with pytest.raises(UnsupportedError, match=r"runs none of the targets it was exported "
                                                   r"for: znver4 uses .*(avx512|sse4a)"):
            _pick_target(path, only, None, host_flags_of(host))
    with pytest.raises(UnsupportedError, match=r"znver4 uses .*avx512f"):
        _pick_target(path, only, None, host_flags_of("x86-64-v3"))


def test_the_first_target_this_host_has_runs_bit_for_bit(exported) -> None:
    """This host's pick runs; the x86-64-v3 member (picked, or named on a znver4 host) bit
    for bit the graph compiled for x86-64-v3; the znver4 member, where it runs, bit for bit
    the graph compiled for znver4 (its own plan) and within rounding of x86-64-v3's."""
    module, path = exported
    model = tilefold.load(path)
    assert model.manifest["target"]["name"] == PICKED
    weaker = tilefold.load(path, target="x86-64-v3")
    named = tilefold.compile(module, "x86-64-v3")
    narrowed = tilefold.compile(module, host_target("x86-64-v3"))  # TILEFOLD_HOST=x86-64-v3
    strong = tilefold.compile(module, "znver4") if STRONG else None
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((ROWS, D)).astype(np.float32)
        (got,) = weaker(x)
        for graph in (named, narrowed):
            assert got.tobytes() == graph(x)[0].tobytes()
        (picked,) = model(x)
        if strong is not None:
            assert picked.tobytes() == strong(x)[0].tobytes()
        np.testing.assert_allclose(picked, got, rtol=1e-4, atol=1e-4)


def test_a_target_the_host_lacks_is_refused(exported) -> None:
    _, path = exported
    if STRONG:  # every member runs here when named
        assert tilefold.load(path, target="znver4").manifest["target"]["name"] == "znver4"
    else:
        lacks = missing_features(sorted(named_target("znver4").features))
        with pytest.raises(UnsupportedError, match=rf"znver4 uses .*{lacks[0]}"):
            tilefold.load(path, target="znver4")
    with pytest.raises(ArtifactError, match="not exported for skylake"):
        tilefold.load(path, target="skylake")


def test_a_chain_the_host_runs_none_of_is_refused(exported, tmp_path) -> None:
    """Each member's features given one no host can be shown to have (its digest no matter:
    the features are checked first): every member refused, each one's lack said."""
    _, path = exported
    copy = tmp_path / "copy.tfa"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    for member in manifest["targets"]:
        member["cpu_features"].append("tilefold-test-feature")
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UnsupportedError, match=r"runs none of the targets .*znver4 uses .*; "
                                                r"x86-64-v3 uses tilefold-test-feature"):
        tilefold.load(copy)
    for bad in ([], [{"name": "x86-64-v3"}], "x86-64-v3"):
        manifest["targets"] = bad
        (copy / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(ArtifactError, match="targets must each"):
            tilefold.load(copy)


def _run_c(binary, path, x, tmp_path, **env) -> tuple[str, np.ndarray | None]:
    x.tofile(tmp_path / "x.bin")
    out = tmp_path / "out.bin"
    out.unlink(missing_ok=True)
    f32, dims = list(DTYPES).index("f32"), ",".join(map(str, x.shape))
    done = subprocess.run([str(binary), str(path), f"i:{f32}:{dims}:{tmp_path / 'x.bin'}",
                           f"o:{f32}:{dims}:{out}"], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), np.fromfile(out, np.float32) if out.exists() else None


def test_a_c_program_runs_the_first_target_this_host_has(exported, tmp_path) -> None:
    """Linked against the znver4 library (the manifest's first): its tf_model_load keeps the
    model on a znver4 host and hands every call to the x86-64-v3 library elsewhere, bit for
    bit the Python loader's pick; TILEFOLD_ARTIFACT_TARGET=x86-64-v3 hands it over on any
    host (bit for bit that member from Python); the znver4 member named is refused where the
    CPU lacks it (TF_ERROR_CPU); a name not in the chain is TF_ERROR_ARGUMENT."""
    _, path = exported
    binary = c_program(path, tmp_path, json.loads((path / MANIFEST).read_text())[
        "targets"][0]["library"]["file"])
    x = np.random.default_rng(3).standard_normal((ROWS, D)).astype(np.float32)
    (want,) = tilefold.load(path)(x)
    for _ in range(12):  # the process also exits cleanly (a library unloaded from under its
        said, got = _run_c(binary, path, x, tmp_path)  # pool's workers crashed a third of exits)
        assert said == "ok"
        assert got.tobytes() == want.tobytes()
    (weaker,) = tilefold.load(path, target="x86-64-v3")(x)
    said, got = _run_c(binary, path, x, tmp_path, TILEFOLD_ARTIFACT_TARGET="x86-64-v3")
    assert said == "ok" and got.tobytes() == weaker.tobytes()
    said, got = _run_c(binary, path, x, tmp_path, TILEFOLD_ARTIFACT_TARGET="znver4")
    if STRONG:
        assert said == "ok" and got.tobytes() == want.tobytes()
    else:
        assert said.startswith("load 3 this CPU runs none of the targets the artifact was "
                               "exported for (znver4 lacks "), said
        assert got is None
    said, _ = _run_c(binary, path, x, tmp_path, TILEFOLD_ARTIFACT_TARGET="skylake")
    assert said.startswith("load 4 TILEFOLD_ARTIFACT_TARGET=skylake: not a target"), said


UNRUNNABLE = next(t for t in ("znver4", "sapphirerapids") if not named_target(t).is_host())


@pytest.mark.parametrize(("chain", "match"), [
    (["x86-64-v3", "znver4"], "cannot chain x86-64-v3 before znver4: it lacks .*avx512f"),
    ([UNRUNNABLE], f"cannot export for {UNRUNNABLE} on this host"),
    (["x86-64-v3", "x86-64-v3"], "names each once"),
    ([], "at least one"),
])
def test_a_chain_that_cannot_be_exported_here_is_refused(chain, match, tmp_path) -> None:
    module = llama_block(np.random.default_rng(1))
    x = np.zeros((2, 64), np.float32)
    with pytest.raises((UnsupportedError, ArtifactError), match=match):
        tilefold.export(module, [x], tmp_path / "out.tfa", targets=chain)
    assert not (tmp_path / "out.tfa").exists()


def test_the_cli_exports_a_chain(tmp_path, capsys) -> None:
    from tilefold.cli.main import main

    module = llama_block(np.random.default_rng(2))
    (tmp_path / "block.tfir").write_text(tilefold.print_module(module))
    out = tmp_path / "cli.tfa"
    assert main(["export", str(tmp_path / "block.tfir"), "-o", str(out), "--bind", "s=3",
                 "--targets", ",".join(CHAIN)]) == 0
    assert [t["name"] for t in json.loads((out / MANIFEST).read_text())["targets"]] == CHAIN
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    (want,) = tilefold.compile(module, "x86-64-v3")(x)
    assert tilefold.load(out, target="x86-64-v3")(x)[0].tobytes() == want.tobytes()
    assert tilefold.load(out).manifest["target"]["name"] == PICKED
    capsys.readouterr()
    assert main(["export", str(tmp_path / "block.tfir"), "-o", str(out), "--bind", "s=3",
                 "--target", "x86-64-v3", "--targets", ",".join(CHAIN)]) == 1
    assert "--target or --targets" in capsys.readouterr().err


def test_a_chain_of_listed_sizes_with_state_runs_from_c(tmp_path) -> None:
    """A symbolic artifact with state (tests/aot/test_state.py's step) for the chain: from C
    through the znver4 library, tf_model_state and every call are those of the member this
    host picks, bit for bit the Python loader's pick; the x86-64-v3 member's bit for bit the
    graph compiled for x86-64-v3."""
    from tests.aot.test_state import ROWS as CACHE_ROWS
    from tests.aot.test_state import SIZES, WIDTH, _run_c_with_state, cached_step, chunks

    module = cached_step(np.random.default_rng(7))
    path = tilefold.export(module, [np.ones((1, WIDTH), np.float32), np.array(0),
                                    np.zeros((CACHE_ROWS, WIDTH), np.float32)],
                           tmp_path / "step.tfa", dynamic_shapes={"s": SIZES},
                           donate={1: 2}, targets=CHAIN)
    binary = c_program(path, tmp_path, json.loads((path / MANIFEST).read_text())[
        "targets"][0]["library"]["file"])
    start = np.random.default_rng(9).standard_normal((CACHE_ROWS, WIDTH)).astype(np.float32)
    said, (outs, state) = _run_c_with_state(binary, path, chunks(3), start, tmp_path)
    assert said == "ok"
    graph = tilefold.compile(module, "x86-64-v3", donate={1: 2})
    model, weaker = tilefold.load(path), tilefold.load(path, target="x86-64-v3")
    assert model.manifest["target"]["name"] == PICKED
    cache = start.copy()
    model.state[0][...] = start
    weaker.state[0][...] = start
    at = 0
    for x, got in zip(chunks(3), outs, strict=True):
        want = graph(x, np.array(at), cache)[0]
        assert got.tobytes() == model(x, np.array(at))[0].tobytes()
        assert weaker(x, np.array(at))[0].tobytes() == want.tobytes()
        at += len(x)
    assert state.tobytes() == model.state[0].tobytes()
    assert weaker.state[0].tobytes() == cache.tobytes()


IMPOSTOR = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void loaded(void) {
  FILE *f = fopen(getenv("TF_TEST_MARKER"), "w");
  if (f) fclose(f);
}
int tf_model_load(const char *dir, void **model) { (void)dir; *model = 0; return 0; }
"""


def test_a_c_program_refuses_a_damaged_library_before_loading_it(exported, tmp_path) -> None:
    """The library tf_model_load would hand the model to (x86-64-v3's, forced) is checked
    against the manifest's size and digest64 before it is dlopen'ed: an impostor of the same
    size (a library whose constructor leaves a marker file when it is loaded), a flipped
    byte and a truncation are each TF_ERROR_CORRUPT with a message naming the file, and the
    impostor's code never runs (it does when loaded: checked first); so does the Python
    loader (ArtifactError)."""
    _, path = exported
    copy = tmp_path / "copy.tfa"
    shutil.copytree(path, copy)
    chain = json.loads((copy / MANIFEST).read_text())["targets"]
    binary = c_program(copy, tmp_path, chain[0]["library"]["file"])
    victim = copy / chain[1]["library"]["file"]
    original = victim.read_bytes()
    marker = tmp_path / "loaded"
    impostor = tmp_path / "impostor.so"
    (tmp_path / "impostor.c").write_text(IMPOSTOR)
    subprocess.run([shutil.which("cc"), "-shared", "-fPIC", str(tmp_path / "impostor.c"), "-o",
                    str(impostor)], check=True)
    code = impostor.read_bytes()
    assert len(code) < len(original)
    padded = code + bytes(len(original) - len(code))  # bytes past its sections: still loads
    x = np.random.default_rng(5).standard_normal((ROWS, D)).astype(np.float32)
    env = {"TILEFOLD_ARTIFACT_TARGET": "x86-64-v3", "TF_TEST_MARKER": str(marker)}

    victim.write_bytes(padded)  # the marker shows a load: loading the impostor leaves it
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(victim)!r})"],
                   check=True, env={**os.environ, **env})
    assert marker.exists()
    marker.unlink()
    said, got = _run_c(binary, copy, x, tmp_path, **env)
    assert said.startswith(f"load 2 {victim}, the code for x86-64-v3: digest64 differs from "
                           "the manifest's"), said
    assert "not loaded" in said and got is None
    assert not marker.exists()  # its constructor never ran

    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x10
    victim.write_bytes(bytes(flipped))
    said, _ = _run_c(binary, copy, x, tmp_path, **env)
    assert said.startswith(f"load 2 {victim}, the code for x86-64-v3: digest64 differs"), said
    with pytest.raises(ArtifactError, match="digest64 differs"):
        tilefold.load(copy, target="x86-64-v3")

    victim.write_bytes(original[:-4096])
    said, _ = _run_c(binary, copy, x, tmp_path, **env)
    assert said.startswith(f"load 2 {victim}, the code for x86-64-v3: {len(original) - 4096} "
                           f"bytes, the manifest says {len(original)}"), said

    victim.write_bytes(original)  # restored: loads and runs again
    said, got = _run_c(binary, copy, x, tmp_path, **env)
    assert said == "ok"
    assert got.tobytes() == tilefold.load(copy, target="x86-64-v3")(x)[0].tobytes()


OWN = ["x86-64-v3", "generic"]  # two targets every x86-64 CI host runs: each records its own


def test_each_target_this_host_runs_records_a_plan_of_its_own(tmp_path) -> None:
    """Every member of a chain this host runs is compiled and recorded for itself (its own
    micro-kernels: AVX2's 6x16, the generic 4x8; program-<k>.json and data-<k>.bin beside
    the last's program.json and data.bin), bit for bit the graph compiled for it, from Python
    and from C (the x86-64-v3 library maps its own data; the generic one, forced, its); a
    damaged data-0.bin is refused by both loaders."""
    module = llama_block(np.random.default_rng(11))
    x = np.random.default_rng(12).standard_normal((8, 64)).astype(np.float32)
    path = tilefold.export(module, [x], tmp_path / "own.tfa", targets=OWN)
    chain = json.loads((path / MANIFEST).read_text())["targets"]
    assert [(t["plan"], t["program"]["file"], t["data"]["file"]) for t in chain] == [
        ("x86-64-v3", "program-0.json", "data-0.bin"), ("generic", "program.json", "data.bin")]
    assert any(k.startswith("gemm_avx2_") for k in chain[0]["kernels"])
    assert any(k.startswith("gemm_generic_") for k in chain[1]["kernels"])
    assert not any("avx" in k for k in chain[1]["kernels"])
    want = {t: tilefold.compile(module, t)(x)[0] for t in OWN}
    assert want["x86-64-v3"].tobytes() != want["generic"].tobytes()  # the plans differ
    assert tilefold.load(path).manifest["target"]["name"] == "x86-64-v3"
    for t in OWN:
        assert tilefold.load(path, target=t)(x)[0].tobytes() == want[t].tobytes()
    binary = c_program(path, tmp_path, chain[0]["library"]["file"])
    assert _run_c(binary, path, x, tmp_path)[1].tobytes() == want["x86-64-v3"].tobytes()
    said, got = _run_c(binary, path, x, tmp_path, TILEFOLD_ARTIFACT_TARGET="generic")
    assert said == "ok" and got.tobytes() == want["generic"].tobytes()
    data = bytearray((path / "data-0.bin").read_bytes())
    data[len(data) // 2] ^= 1
    (path / "data-0.bin").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"data-0\.bin: digest64 differs"):
        tilefold.load(path)
    said, _ = _run_c(binary, path, x, tmp_path)
    assert said.startswith(f"load 2 {path}/data-0.bin: digest64 differs"), said
    assert tilefold.load(path, target="generic")(x)[0].tobytes() == want["generic"].tobytes()


def test_listed_sizes_record_a_plan_of_its_own_per_target(tmp_path) -> None:
    """A symbolic artifact (listed sizes) for a chain this host runs: each member's classes
    are its own recording, bit for bit its graph at every size."""
    module = llama_block(np.random.default_rng(13))
    x = np.zeros((2, 64), np.float32)
    sizes = [1, 3, 8]
    path = tilefold.export(module, [x], tmp_path / "own.tfa", dynamic_shapes={"s": sizes},
                           targets=OWN)
    chain = json.loads((path / MANIFEST).read_text())["targets"]
    assert [t["plan"] for t in chain] == OWN and "size_classes" in chain[0]
    binary = c_program(path, tmp_path, chain[0]["library"]["file"])
    for t in OWN:
        model, graph = tilefold.load(path, target=t), tilefold.compile(module, t)
        for n in (*sizes, 1):
            xs = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
            want = graph(xs)[0]
            assert model(xs)[0].tobytes() == want.tobytes()
            said, got = _run_c(binary, path, xs, tmp_path, TILEFOLD_ARTIFACT_TARGET=t)
            assert said == "ok" and got.tobytes() == want.tobytes()


def test_a_target_this_host_cannot_run_is_planned_from_its_description() -> None:
    """Its peak is a model (vector width, FMAs), never a measurement of code that cannot run
    here: planning for it does not stop at measuring."""
    from tilefold.strategy.cost import machine_for, model_peak_gflops

    z4, v3 = named_target("znver4"), named_target("x86-64-v3")
    assert model_peak_gflops(z4, 2) == 2 * model_peak_gflops(v3, 2) == 4 * model_peak_gflops(
        v3, 1)
    far = named_target(UNRUNNABLE)
    assert machine_for(far, 3).gflops == model_peak_gflops(far, 3)


PLAN_SCRIPT = """
import json, sys
import numpy as np, tilefold
from tests.aot.test_symbolic import llama_block
from tilefold.errors import UnsupportedError
from tilefold.runtime.compiled_module import planning_only
rows, d, strong = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
module = llama_block(np.random.default_rng(36), d=d, heads=12, f=4 * d)
found = {}
for name in sys.argv[4:]:
    graph = tilefold.compile(module, name)
    with planning_only():
        found[name] = [[d.winner.method, d.kernel.source] for d in graph.decisions((rows, d))
                       if d.problem.names[0] == "matmul"]
    if name == "znver4" and not strong:
        try:
            graph(np.zeros((rows, d), np.float32))
            found["ran"] = True
        except UnsupportedError as exc:
            found["refused"] = str(exc)
print(json.dumps(found))
"""


def test_znver4s_own_plan_is_made_on_any_host() -> None:
    """The plan for znver4 (the chain's AVX-512 member) made from its description, on any
    host: under `planning_only()` its kernels are built for znver4 (compiling for it works
    anywhere) but not callable, and its GEMMs take the AVX-512 micro-kernel where
    x86-64-v3's take AVX2's; on a host without it, running that plan is refused, never tried.
    In a process of its own: the kernels' process-wide caches keep the refusing functions."""
    done = subprocess.run([sys.executable, "-c", PLAN_SCRIPT, str(ROWS), str(D),
                           str(int(STRONG)), *CHAIN], capture_output=True, text=True,
                          timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, isa in zip(CHAIN, ("avx512", "avx2"), strict=True):
        gemms = found[name]
        assert len(gemms) == 4 and all(m == "blocks.gemm" for m, _ in gemms), gemms
        assert all(f"GEMM {isa}_" in source for _, source in gemms), gemms
    if not STRONG:
        assert "ran" not in found and "cannot run on this" in found["refused"]
