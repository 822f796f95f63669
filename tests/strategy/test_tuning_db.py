"""The tuning database: round trip, corrupt and stale files rebuilt, concurrent writers merged."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np

from tilefold.strategy.tuning_db import SCHEMA, TuningDB, key_fields, key_of


def _entry(signature: str, winner: str = "extern.numpy{}") -> tuple[str, dict]:
    fields = key_fields(signature, [[128, 768]], 2, candidates=[winner], generators="g")
    return key_of(fields), {**fields, "winner": winner, "timings": {winner: 1e-3}}


def test_record_then_lookup(tmp_path):
    db = TuningDB(tmp_path / "db.json")
    key, entry = _entry("softmax(a0)")
    db.record(key, entry)
    assert TuningDB(tmp_path / "db.json").lookup(key)["winner"] == "extern.numpy{}"
    data = json.loads((tmp_path / "db.json").read_text())
    assert data["schema"] == SCHEMA and key in data["entries"]


def test_file_is_parsed_once_per_version(tmp_path, monkeypatch):
    path = tmp_path / "db.json"
    key, entry = _entry("softmax(a0)")
    TuningDB(path).record(key, entry)
    reads = []
    original = TuningDB._read
    monkeypatch.setattr(TuningDB, "_read", lambda self: reads.append(1) or original(self))
    for _ in range(3):
        assert TuningDB(path).lookup(key) is not None
    assert len(reads) == 1
    other, other_entry = _entry("exp(a0)")
    TuningDB(path).record(other, other_entry)  # a new version of the file is read again
    assert TuningDB(path).lookup(other) is not None and TuningDB(path).lookup(key) is not None


def test_corrupt_file_is_reported_set_aside_and_rebuilt(tmp_path, caplog):
    path = tmp_path / "db.json"
    path.write_text('{"schema": 1, "entries": {"trunc')
    db = TuningDB(path)
    with caplog.at_level(logging.WARNING, logger="tilefold.tuning"):
        assert db.lookup("anything") is None
    assert "corrupt or stale" in caplog.text
    assert (tmp_path / "db.json.bad").exists()
    key, entry = _entry("exp(a0)")
    db.record(key, entry)
    assert TuningDB(path).lookup(key) is not None


def test_stale_schema_and_edited_entries_are_dropped(tmp_path, caplog):
    path = tmp_path / "db.json"
    path.write_text(json.dumps({"schema": SCHEMA - 1, "entries": {}}))
    with caplog.at_level(logging.WARNING, logger="tilefold.tuning"):
        assert TuningDB(path).entries() == {}
    assert "schema" in caplog.text
    key, entry = _entry("relu(a0)")
    edited = {**entry, "signature": "something else"}
    path.write_text(json.dumps({"schema": SCHEMA, "entries": {key: edited}}))
    assert TuningDB(path).lookup(key) is None


_WRITER = """
import sys
from tilefold.strategy.tuning_db import TuningDB, key_fields, key_of
db = TuningDB()
for i in range(40):
    fields = key_fields(f"{sys.argv[1]}-{i}", [[i]], 1, candidates=["extern.numpy{}"],
                        generators="g")
    db.record(key_of(fields), {**fields, "winner": "extern.numpy{}", "timings": {}})
"""


def test_two_processes_writing_at_once_lose_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, name]) for name in ("a", "b")]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    entries = TuningDB(tmp_path / "tuning" / "db.json").entries()
    assert len(entries) == 80
    assert not list((tmp_path / "tuning").glob(".db.*.tmp"))


_SOFTMAX = """func @main(%x: f32[8,48]) -> (f32[8,48]) {
  %0 = softmax(%x) : f32[8,48]
  return(%0)
}"""


def _softmax_problem():
    from tilefold.ir import parse_module
    from tilefold.strategy import Problem

    return Problem.of(parse_module(_SOFTMAX)["main"].ops[0], [(8, 48)])


def _record_numpy_winner(db: TuningDB, problem, ctx) -> None:
    """An entry naming extern.numpy the winner of the race among today's candidates."""
    from tilefold.strategy import select

    candidates, _ = select.propose_all(problem, ctx)
    key, fields = select.db_key(problem, ctx, candidates)
    db.record(key, {**fields, "winner": "extern.numpy{}", "timings": {"extern.numpy{}": 1e-6}})


def _check_softmax(decision) -> None:
    x = np.random.default_rng(7).standard_normal((8, 48)).astype(np.float32)
    y = np.empty_like(x)
    decision.kernel.run(x, y)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_new_candidate_is_not_answered_by_an_old_entry(tmp_path):
    """The candidate set is in the key: once a method joins, the problem is chosen again
    (before, the entry's winner came back and the newcomer was never measured)."""
    from tilefold.strategy import (
        Kernel,
        Method,
        context,
        decide,
        register_method,
        unregister_method,
    )

    class Newcomer(Method):
        name = "test.newcomer"
        family = "extern"

        def propose(self, problem, ctx):
            def run(x, y):
                e = np.exp(x - x.max(axis=1, keepdims=True))
                np.copyto(y, e / e.sum(axis=1, keepdims=True))
            return [self.candidate({}, 1e3, lambda: Kernel(run))]  # never the cost model's pick

    db, problem, ctx = TuningDB(tmp_path / "db.json"), _softmax_problem(), context()
    _record_numpy_winner(db, problem, ctx)
    before = decide(problem, ctx, db, None)
    assert before.winner.key == "extern.numpy{}" and "tuning database" in before.why
    _check_softmax(before)
    register_method(Newcomer())
    try:
        after = decide(problem, ctx, db, None)
    finally:
        unregister_method("test.newcomer")
    assert "test.newcomer{}" in [c.key for c in after.candidates]
    assert "tuning database" not in after.why and after.winner.key != "extern.numpy{}"
    _check_softmax(after)


def test_a_changed_generator_is_not_answered_by_an_old_entry(tmp_path, monkeypatch):
    """The generators' digest is in the key: other generator code misses the old entry."""
    from tilefold.strategy import METHODS, context, decide, select

    db, problem, ctx = TuningDB(tmp_path / "db.json"), _softmax_problem(), context()
    _record_numpy_winner(db, problem, ctx)
    assert "tuning database" in decide(problem, ctx, db, None).why
    monkeypatch.setattr(type(METHODS["extern.numpy"]), "generators", ("tilefold.codegen.llvm.cpu",))
    select._digest.cache_clear()
    after = decide(problem, ctx, db, None)
    assert "tuning database" not in after.why
    _check_softmax(after)
