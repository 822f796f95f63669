"""Saved generation steps on disk: named by model and options, then by the code that made them;
saving one removes those it supersedes and keeps only the most recently used others."""

import os

import pytest

from tilefold.frontend import gguf_generator
from tilefold.frontend.gguf_generator import MAX_SAVED_STEPS, _prune, _saved_path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return model


def _make(path, mtime):
    path.mkdir(parents=True)
    (path / "manifest.json").write_text("{}")
    os.utime(path, (mtime, mtime))
    return path


def test_names_split_model_from_the_code_that_made_it(cache, monkeypatch):
    first = _saved_path(cache, "int8", 64, False)
    assert first == _saved_path(cache, "int8", 64, False)
    monkeypatch.setattr(gguf_generator, "code_digest", lambda: "other code")
    rebuilt = _saved_path(cache, "int8", 64, False)
    other = _saved_path(cache, "int4", 64, False)
    assert rebuilt != first and rebuilt.name.split("-")[0] == first.name.split("-")[0]
    assert other.name.split("-")[0] != first.name.split("-")[0]


def test_saving_removes_superseded_and_least_recently_used_steps(tmp_path):
    steps = tmp_path / "steps"
    old_same = _make(steps / "aaaa-1111.tfa", 100)  # this model, older code: superseded
    others = [_make(steps / f"b{i:03d}-2222.tfa", 200 + i) for i in range(MAX_SAVED_STEPS + 2)]
    saved = _make(steps / "aaaa-3333.tfa", 50)  # the newest save (an old mtime changes nothing)
    _prune(saved)
    assert saved.exists() and not old_same.exists()
    left = sorted(p for p in steps.iterdir() if p != saved)
    assert left == sorted(others[-MAX_SAVED_STEPS:])  # the most recently used others
