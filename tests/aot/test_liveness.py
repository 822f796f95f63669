"""Workspace sharing (`aot/liveness.py`): buffers whose lifetimes over the step program's calls
do not overlap share memory, the others never, and the loaded artifact still computes bit for
bit what the compiled graph does, whatever its workspace held before the call."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tilefold
from tests.aot.graphs import GRAPHS, RNG_SEED, random_inputs
from tilefold.aot.liveness import lifetimes, place, share_workspace
from tilefold.artifact.format import PROGRAM


def _steps(buffers, calls, pointers=(), objects=(), inputs=(), outputs=()):
    return {"buffers": [{"kind": k, "bytes": n, **({"offset": 0} if k == "data" else {})}
                        for k, n in buffers],
            "pointers": [list(map(list, p)) for p in pointers],
            "objects": [{"at": list(a), "shape": [1], "strides": [4]} for a in objects],
            "calls": [{"symbol": f"m0.f{i}", "signature": "p" * len(args),
                       "args": [list(a) for a in args]} for i, args in enumerate(calls)],
            "inputs": [{"at": list(a), "strides": [4]} for a in inputs],
            "outputs": [{"at": list(a), "strides": [4]} for a in outputs],
            "status": [i for i, (k, _) in enumerate(buffers) if k == "status"]}


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_a_chain_of_intermediates_reuses_memory() -> None:
    """x -> t1 -> t2 -> t3 -> y: t1 and t3 never live at once, so they share; t2 meets both."""
    steps = _steps([("input", 64), ("workspace", 4000), ("workspace", 4000),
                    ("workspace", 4000), ("output", 64)],
                   [[("addr", (0, 0)), ("addr", (1, 0))], [("addr", (1, 0)), ("addr", (2, 0))],
                    [("addr", (2, 0)), ("addr", (3, 0))], [("addr", (3, 0)), ("addr", (4, 0))]],
                   inputs=[(0, 0)], outputs=[(4, 0)])
    assert lifetimes(steps) == {0: (0, 0), 1: (0, 1), 2: (1, 2), 3: (2, 3), 4: (3, 3)}
    shared = share_workspace(steps)
    assert [b["kind"] for b in shared["buffers"]] == ["input", "output", "workspace"]
    arena = shared["buffers"][2]["bytes"]
    assert arena < 3 * 4000  # two slots, not three
    at = [call["args"][1][1] for call in shared["calls"][:3]]  # where t1, t2, t3 went
    assert all(ref[0] == 2 for ref in at) and at[0][1] == at[2][1] != at[1][1]
    assert shared["inputs"][0]["at"] == [0, 0] and shared["outputs"][0]["at"] == [1, 0]


def test_a_parameter_block_keeps_what_it_points_to_alive() -> None:
    """A call reading a parameter block (data) whose pointer words point into a workspace
    buffer touches that buffer: it lives while the block is used, transitively."""
    steps = _steps([("data", 64), ("data", 64), ("workspace", 4096), ("workspace", 4096),
                    ("workspace", 4096)],
                   [[("addr", (2, 0))], [("addr", (3, 0))], [("addr", (0, 0))],
                    [("addr", (4, 0))]],
                   pointers=[((0, 8), (1, 0)), ((1, 0), (2, 16))])
    spans = lifetimes(steps)
    assert spans[2] == (0, 2) and spans[3] == (1, 1) and spans[4] == (3, 3)
    shared = share_workspace(steps)
    (where, to), (where2, to2) = shared["pointers"]
    assert where == [0, 8] and to == [1, 0] and where2 == [1, 0] and to2[0] == 2
    first = shared["calls"][0]["args"][0][1]
    assert to2[1] == first[1] + 16  # the pointer word follows its buffer into the arena


def test_objects_inputs_outputs_and_status_are_never_shared() -> None:
    steps = _steps([("workspace", 256), ("workspace", 256), ("status", 8), ("workspace", 256)],
                   [[("object", 0)], [("addr", (1, 0)), ("addr", (2, 0))], [("addr", (3, 0))]],
                   objects=[(0, 64)], outputs=[(3, 0)])
    assert lifetimes(steps)[0] == (0, 0)  # through its array header
    shared = share_workspace(steps)
    kinds = [b["kind"] for b in shared["buffers"]]
    assert kinds == ["status", "workspace", "workspace"] and shared["status"] == [0]
    assert shared["outputs"][0]["at"] == [1, 0]  # the output's buffer kept to itself
    assert shared["objects"][0]["at"] == [2, 64] or shared["objects"][0]["at"][0] == 2


def test_offsets_that_are_size_formulas_are_shifted() -> None:
    steps = _steps([("workspace", 4096), ("workspace", 4096)],
                   [[("addr", (0, 0))], [("addr", (1, 0))], [("addr", (0, 0))]])
    steps["calls"][1]["args"][0][1] = [1, {"n": [4, 8]}]
    steps["calls"][2]["args"][0][1] = [0, {"t": [1, 0, 64, 128]}]
    shared = share_workspace(steps)
    a, b = (shared["calls"][i]["args"][0][1] for i in (1, 2))
    base = shared["calls"][0]["args"][0][1][1]
    other = a[1]["n"][0] - 4
    assert a[1] == {"n": [4 + other, 8]} and b[1] == {"t": [1, base, base + 64, base + 128]}
    assert other != base  # both live at call 1: apart


@pytest.mark.parametrize("seed", range(5))
def test_placement_never_overlaps_buffers_that_live_together(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = {b: int(rng.integers(1, 50_000)) for b in range(60)}
    spans = {}
    for b in sizes:
        first = int(rng.integers(0, 40))
        spans[b] = (first, first + int(rng.integers(0, 8)))
    at, total = place(sizes, spans)
    for a in sizes:
        assert at[a] % 64 == 0 and at[a] + sizes[a] + 64 <= total
        for b in sizes:
            if a < b and spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]:
                assert not _overlap((at[a], at[a] + sizes[a] + 64),
                                    (at[b], at[b] + sizes[b] + 64))
    peak = max(sum(-(-(sizes[b] + 64) // 64) * 64 for b in sizes
                   if spans[b][0] <= i <= spans[b][1]) for i in range(48))
    assert peak <= total < sum(-(-(n + 64) // 64) * 64 for n in sizes.values())


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_a_workspace_full_of_garbage_changes_nothing(name: str, tmp_path) -> None:
    """Shared memory holds the last buffer's bytes, not zeros: every buffer of the loaded
    artifact but its data is filled with NaN bytes before each call, and the results are
    still the compiled graph's, bit for bit (no kernel reads what it did not write)."""
    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS[name](rng)
    path = tilefold.export(module, random_inputs(module, rng), tmp_path / f"{name}.tfa")
    steps = json.loads((path / PROGRAM).read_text())
    loaded, compiled = tilefold.load(path), tilefold.compile(module)
    kinds = [b["kind"] for b in steps["buffers"]]
    for _ in range(2):
        for kind, buffer in zip(kinds, loaded.buffers, strict=True):
            if kind in ("workspace", "output"):
                buffer[:] = 0xFF
        inputs = random_inputs(module, rng)
        for g, w in zip(loaded(*inputs), compiled(*inputs), strict=True):
            assert g.tobytes() == w.tobytes()


def test_a_symbolic_artifacts_shared_workspace_full_of_garbage_changes_nothing(tmp_path) -> None:
    """Each size class shares its workspace by lifetime (at the class's largest sizes), and
    the classes share one memory (a call runs one class): NaN bytes in every class's
    workspace before each call change no result, at any size."""
    from tests.aot.test_symbolic import inputs, llama_block

    module = llama_block(np.random.default_rng(3))
    x = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    path = tilefold.export(module, [x], tmp_path / "llama.tfa", dynamic_shapes={"s": (1, 12)})
    program = json.loads((path / PROGRAM).read_text())
    for spec in program["classes"]:
        kinds = [b["kind"] for b in spec["program"]["buffers"]]
        assert kinds.count("workspace") == 1  # one arena per class
    model, graph = tilefold.load(path), tilefold.compile(module)
    arenas = {next(buffer.ctypes.data for b, buffer in zip(spec["program"]["buffers"],
                                                            c.buffers, strict=True)
                   if b["kind"] == "workspace")
              for c, spec in zip(model._classes, program["classes"], strict=True)}
    assert len(program["classes"]) >= 2 and len(arenas) == 1  # one memory for every class
    for n in [*range(1, 13), 5, 1]:
        for c, spec in zip(model._classes, program["classes"], strict=True):
            for b, buffer in zip(spec["program"]["buffers"], c.buffers, strict=True):
                if b["kind"] == "workspace":
                    buffer[:] = 0xFF
        x = inputs(n, seed=n)[0]
        (got,), (want,) = model(x), graph(x)
        assert got.tobytes() == want.tobytes(), n
