"""Method registration, rejections with reasons, and fallback when a method fails."""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil

import numpy as np
import pytest

import tilefold
import tilefold.strategy.methods
from tilefold.errors import FallbackError, TilefoldError
from tilefold.ir import parse_module
from tilefold.strategy import (
    FAMILIES,
    METHODS,
    Kernel,
    Method,
    Problem,
    TuningDB,
    builtin_methods,
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


def test_every_method_class_registers_itself_in_its_file():
    """One route: a method file decorates its class, the package imports every file."""
    classes = []
    for info in pkgutil.iter_modules(tilefold.strategy.methods.__path__):
        module = importlib.import_module(f"tilefold.strategy.methods.{info.name}")
        classes += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                    if issubclass(cls, Method) and cls.__module__ == module.__name__
                    and "name" in vars(cls)]  # a base without a name is no method
    assert len(classes) >= 7
    assert {cls.name: cls for cls in classes} == {m.name: type(m) for m in builtin_methods()}
    assert all(type(METHODS[cls.name]) is cls for cls in classes)


def test_register_method_decorates_a_class():
    @register_method
    class Decorated(Method):
        name = "test.decorated"
        family = "extern"

    try:
        assert isinstance(METHODS["test.decorated"], Decorated)
    finally:
        unregister_method("test.decorated")


def test_duplicate_and_unknown_family_rejected():
    with pytest.raises(TilefoldError, match="registered already"):
        register_method(METHODS["extern.numpy"])
    bad = type("Bad", (Method,), {"name": "test.bad", "family": "magic"})()
    with pytest.raises(TilefoldError, match="family"):
        register_method(bad)


def test_failing_methods_fall_back_and_explain_why(tmp_path, caplog, allow_fallback):
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


@pytest.mark.parametrize("method, message", [(Broken, "no such instruction"),
                                             (Crashing, "bug in a method")])
def test_strict_mode_raises_when_a_method_fails(tmp_path, method, message):
    """TILEFOLD_STRICT (on for the suite) turns the quiet move to the next method into an error
    naming the group, the method and its failure."""
    bad = method()
    register_method(bad)
    try:
        with pytest.raises(FallbackError, match=f"softmax.*{bad.name}.*{message}"):
            decide(_problem(), context(), TuningDB(tmp_path / "db.json"), None)
    finally:
        unregister_method(bad.name)


def test_strict_extern_declines_math_it_would_run_on_the_reference(tmp_path, monkeypatch):
    """A lone `sin` has no native kernel and no library call in either extern table: strict
    mode raises rather than evaluate it with the f64 reference; without strict, extern runs it."""
    text = "func @main(%x: f32[3,5]) -> (f32[3,5]) {\n  %0 = sin(%x) : f32[3,5]\n  return(%0)\n}"
    problem = Problem.of(parse_module(text)["main"].ops[0], [(3, 5)])
    db = TuningDB(tmp_path / "db.json")
    with pytest.raises(FallbackError, match="reference implementation of sin"):
        decide(problem, context(), db, None)
    monkeypatch.delenv("TILEFOLD_STRICT")
    d = decide(problem, context(), db, None)
    x = np.random.default_rng(1).uniform(0.1, 4.0, (3, 5)).astype(np.float32)
    y = np.empty_like(x)
    d.kernel.run(x, y)
    np.testing.assert_allclose(y, np.sin(x.astype(np.float64)), rtol=1e-6)


def test_compile_strict_argument_overrides_the_environment(monkeypatch):
    """`tilefold.compile(..., strict=)` decides over TILEFOLD_STRICT, both ways."""
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    register_method(Broken())
    try:
        (got,) = tilefold.compile(parse_module(TEXT), strict=False)(x)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        monkeypatch.delenv("TILEFOLD_STRICT")
        with pytest.raises(FallbackError, match=r"test\.broken"):
            tilefold.compile(parse_module(TEXT), strict=True)(x)
    finally:
        unregister_method("test.broken")


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
