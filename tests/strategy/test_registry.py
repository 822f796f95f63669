"""Method registration, rejections with reasons, and fallback when a method fails."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tilefold.errors import TilefoldError
from tilefold.ir import parse_module
from tilefold.strategy import (
    FAMILIES,
    METHODS,
    Kernel,
    Method,
    Problem,
    TuningDB,
    context,
    decide,
    register_method,
    unregister_method,
)

TEXT = """func @main(%x: f32[4,32]) -> (f32[4,32]) {
  %0 = softmax(%x) : f32[4,32]
  return(%0)
}"""


def _problem() -> Problem:
    op = parse_module(TEXT)["main"].ops[0]
    return Problem.of(op, [(4, 32)])


class Broken(Method):
    """Claims to be the cheapest, then fails to build."""

    name = "test.broken"
    family = "hand-written"

    def propose(self, problem, ctx):
        def build():
            raise RuntimeError("no such instruction")
        return [self.candidate({}, 0.0, build)]


class Crashing(Method):
    name = "test.crashing"
    family = "auto-codegen"

    def propose(self, problem, ctx):
        raise ValueError("bug in a method")


def test_builtin_methods_cover_every_family():
    assert {m.family for m in METHODS.values()} >= set(FAMILIES)


def test_duplicate_and_unknown_family_rejected():
    with pytest.raises(TilefoldError, match="registered already"):
        register_method(METHODS["extern.numpy"])
    bad = type("Bad", (Method,), {"name": "test.bad", "family": "magic"})()
    with pytest.raises(TilefoldError, match="family"):
        register_method(bad)


def test_failing_methods_fall_back_and_explain_why(tmp_path, caplog):
    register_method(Broken())
    register_method(Crashing())
    try:
        with caplog.at_level(logging.WARNING):
            d = decide(_problem(), context(), TuningDB(tmp_path / "db.json"), None)
    finally:
        unregister_method("test.broken")
        unregister_method("test.crashing")
    assert d.winner.method != "test.broken"
    assert "no such instruction" in d.failures["test.broken{}"]
    assert any(r.method == "test.crashing" and "bug in a method" in r.reason
               for r in d.rejections)
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    y = np.empty_like(x)
    d.kernel.run(x, y)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    assert "trying the next one" in caplog.text


def test_a_new_method_is_a_registration(tmp_path):
    class Free(Method):
        name = "test.free"
        family = "extern"

        def propose(self, problem, ctx):
            def run(x, y):
                np.copyto(y, np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True))
            return [self.candidate({"v": 1}, -1.0, lambda: Kernel(run))]

    register_method(Free())
    try:
        d = decide(_problem(), context(), TuningDB(tmp_path / "db.json"), None)
    finally:
        unregister_method("test.free")
    assert d.winner.key == 'test.free{"v":1}'
