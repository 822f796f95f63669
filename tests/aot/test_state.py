"""Artifacts with state (`donate=`): a donated argument, such as a KV cache, lives in the loaded
model (`model.state`), is written in place by every call and is never copied in or out; a
sequence of calls gives, bit for bit, what the compiled graph gives on its own arrays, at
listed sizes of a symbolic dim (`dynamic_shapes={"s": [...]}`) whose classes share one state.
A result donated but not written in place, sizes outside the list and a damaged state entry in
the manifest are refused with TilefoldErrors."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
import pytest

import tilefold
from tests.aot.test_symbolic import c_program
from tilefold import Builder, Module
from tilefold.artifact.format import DTYPES, MANIFEST
from tilefold.errors import ArtifactError, ShapeError, UnsupportedError
from tilefold.ir.types import SymDim

ROWS, WIDTH = 24, 16
SIZES = [1, 3, 4, 8]


def cached_step(rng: np.random.Generator) -> Module:
    """Rows x[?s, 16] written into a cache[24, 16] at positions start.., then every row
    attends (softmax of x . cache^T over the rows written so far) and is projected."""
    s = SymDim("s")
    b = Builder()
    x = b.arg("x", "f32", (s, WIDTH))
    start = b.arg("start", "i64", ())
    cache = b.arg("cache", "f32", (ROWS, WIDTH))
    positions = b.op("arange", shape=(s,)) + start
    written = b.op("index_put", cache, x, positions, axes=(0,))
    keys = b.op("arange", shape=(ROWS,))
    mask = b.op("le", keys.reshape(1, ROWS), positions.reshape(s, 1))
    scores = b.op("matmul", x, written, transpose_b=True)
    scores = b.op("where", mask, scores, b.constant(np.float32(-1e30)))
    out = b.op("softmax", scores) @ written
    w = (rng.standard_normal((WIDTH, WIDTH)) / 4).astype(np.float32)
    return b.build(out @ b.constant(w), written)


def run_jit(module: Module, chunks: list[np.ndarray], cache: np.ndarray | None = None
            ) -> tuple[list[np.ndarray], np.ndarray]:
    graph = tilefold.compile(module, donate={1: 2}, strict=True)
    cache = np.zeros((ROWS, WIDTH), np.float32) if cache is None else cache.copy()
    outs, at = [], 0
    for x in chunks:
        outs.append(graph(x, np.array(at), cache)[0])
        at += len(x)
    return outs, cache


def chunks(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, WIDTH)).astype(np.float32) for n in (8, 3, 1, 4, 1, 1)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    module = cached_step(np.random.default_rng(7))
    path = tilefold.export(module, [np.ones((1, WIDTH), np.float32), np.array(0),
                                    np.zeros((ROWS, WIDTH), np.float32)],
                           tmp_path_factory.mktemp("state") / "step.tfa",
                           dynamic_shapes={"s": SIZES}, donate={1: 2})
    return module, path


def test_state_advances_in_place_bit_identical_to_the_jit(exported) -> None:
    module, path = exported
    model = tilefold.load(path)
    assert [s["name"] for s in model.inputs] == ["x", "start"]
    assert len(model.outputs) == 1 and len(model.state) == 1
    assert model.state[0].shape == (ROWS, WIDTH) and not model.state[0].any()
    for seed in (0, 1):  # a second sequence on a state set back to zero
        model.state[0][...] = 0
        expected, cache = run_jit(module, chunks(seed))
        at = 0
        for x, want in zip(chunks(seed), expected, strict=True):
            got, = model(x, np.array(at))
            np.testing.assert_array_equal(got, want)
            at += len(x)
        np.testing.assert_array_equal(model.state[0], cache)
        assert model.state[0][:at].any() and not model.state[0][at:].any()


def test_manifest_lists_the_state_and_the_sizes(exported) -> None:
    _, path = exported
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["state"] == [{"input": 2, "output": 1}]
    assert manifest["symbols"] == {"s": {"min": 1, "max": 8, "sizes": SIZES}}
    covered = [n for lo, hi in manifest["size_classes"] for n in range(lo, hi + 1)]
    assert covered == SIZES


def test_a_size_not_listed_is_refused(exported) -> None:
    _, path = exported
    model = tilefold.load(path)
    with pytest.raises(ShapeError, match=r"\?s = 2 is not a size .*1, 3, 4, 8"):
        model(np.ones((2, WIDTH), np.float32), np.array(0))
    with pytest.raises(ShapeError, match="besides the 1 of its state"):
        model(np.ones((1, WIDTH), np.float32), np.array(0), model.state[0])


def test_a_damaged_state_entry_is_refused(exported, tmp_path) -> None:
    import shutil
    _, path = exported
    copy = tmp_path / "copy.tfa"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    for bad in ([{"input": 0, "output": 1}], [{"input": 9, "output": 1}], {"input": 2}):
        manifest["state"] = bad  # the manifest is checked before its digest matters
        (copy / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(ArtifactError, match="state"):
            tilefold.load(copy)


def test_a_donated_result_not_written_in_place_is_refused(tmp_path) -> None:
    """Result 0 (a fresh sum) donated to an argument it does not overwrite in place."""
    b = Builder()
    x, y = b.arg("x", "f32", (4, 4)), b.arg("y", "f32", (4, 4))
    module = b.build(x @ y, x + y)
    arrays = [np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)]
    with pytest.raises(UnsupportedError, match="not written into it in place"):
        tilefold.export(module, arrays, tmp_path / "bad.tfa", donate={0: 1})


@pytest.fixture(scope="module")
def exported_static(tmp_path_factory):
    """The same step for 4 rows only: one program, the C runtime of static shapes."""
    module = cached_step(np.random.default_rng(7))
    path = tilefold.export(module, [np.ones((4, WIDTH), np.float32), np.array(0),
                                    np.zeros((ROWS, WIDTH), np.float32)],
                           tmp_path_factory.mktemp("state") / "step4.tfa", donate={1: 2})
    return module, path


def _run_c_with_state(binary, path, xs, cache, tmp_path, extra: bool = False) -> tuple[str, Any]:
    """run_model.c -s: the model's state set to `cache` through tf_model_state, each x run
    once in turn (at rows written so far), the outputs and the state's bytes read back.
    `extra`: the state passed as a third input too (which tf_model_run must refuse)."""
    f32, i64 = list(DTYPES).index("f32"), list(DTYPES).index("i64")
    tmp_path = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"  # files of this run only
    tmp_path.mkdir()
    cache.tofile(tmp_path / "state-in.bin")
    argv, at = [], 0
    for g, x in enumerate(xs):
        argv += ["--"] if g else []
        x.tofile(tmp_path / f"x{g}.bin")
        np.array(at).tofile(tmp_path / f"at{g}.bin")
        argv += [f"i:{f32}:{x.shape[0]},{WIDTH}:{tmp_path / f'x{g}.bin'}",
                 f"i:{i64}:-:{tmp_path / f'at{g}.bin'}",
                 *([f"i:{f32}:{ROWS},{WIDTH}:{tmp_path / 'state-in.bin'}"] if extra else []),
                 f"o:{f32}:{x.shape[0]},{WIDTH}:{tmp_path / f'out{g}.bin'}"]
        at += len(x)
    done = subprocess.run([str(binary), str(path), "-s", str(tmp_path / "state-in.bin"),
                           str(tmp_path / "state-out.bin"), *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    outs = [np.fromfile(tmp_path / f"out{g}.bin", np.float32).reshape(x.shape)
            for g, x in enumerate(xs) if (tmp_path / f"out{g}.bin").exists()]
    state = np.fromfile(tmp_path / "state-out.bin", np.float32).reshape(ROWS, WIDTH) \
        if (tmp_path / "state-out.bin").exists() else None
    return done.stdout.strip(), (outs, state)


@pytest.mark.parametrize("which", ["symbolic", "static"])
def test_the_c_runtime_keeps_the_state_in_place(which, exported, exported_static,
                                                 tmp_path) -> None:
    """From C the state is the model's buffer (tf_model_state) and tf_model_run takes the
    other inputs only: a cache written into that buffer before the first call is what the
    calls read, each call advances it where it lies (never copied in or out: the caller
    passes no state), and a sequence gives bit for bit what the compiled graph gives on its
    own arrays, the buffer after it bit for bit the graph's cache. The state given as an
    input too is refused with an error code."""
    module, path = exported if which == "symbolic" else exported_static
    xs = chunks(2) if which == "symbolic" else [
        np.random.default_rng(g).standard_normal((4, WIDTH)).astype(np.float32)
        for g in range(4)]
    start = np.random.default_rng(9).standard_normal((ROWS, WIDTH)).astype(np.float32)
    binary = c_program(path, tmp_path)
    said, (outs, state) = _run_c_with_state(binary, path, xs, start, tmp_path)
    assert said == "ok"
    want, cache = run_jit(module, xs, start)
    for got, w in zip(outs, want, strict=True):
        assert got.tobytes() == w.tobytes()
    assert state.tobytes() == cache.tobytes()
    assert not np.array_equal(cache, start)  # the calls wrote the state
    said, _ = _run_c_with_state(binary, path, xs[:1], start, tmp_path, extra=True)
    assert said.startswith("run 4 the model takes 2 inputs and 1 outputs, not 3 and 1"), said
    if which == "symbolic":  # a size between two listed ones
        said, _ = _run_c_with_state(binary, path, [xs[0][:2]], start, tmp_path)
        assert said == "run 4 ?s = 2 is not a size this artifact was exported for (between " \
            "1 and 3, which it was)", said
