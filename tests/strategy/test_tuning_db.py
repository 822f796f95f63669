"""The tuning database: round trip, corrupt and stale files rebuilt, concurrent writers merged."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from tilefold.strategy.tuning_db import SCHEMA, TuningDB, key_fields, key_of


def _entry(signature: str, winner: str = "extern.numpy{}") -> tuple[str, dict]:
    fields = key_fields(signature, [[128, 768]], 2)
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
    fields = key_fields(f"{sys.argv[1]}-{i}", [[i]], 1)
    db.record(key_of(fields), {**fields, "winner": "extern.numpy{}", "timings": {}})
"""


def test_two_processes_writing_at_once_lose_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, name]) for name in ("a", "b")]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    entries = TuningDB(tmp_path / "tuning" / "db.json").entries()
    assert len(entries) == 80
    assert not list((tmp_path / "tuning").glob(".db.*.tmp"))
