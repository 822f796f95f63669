"""The textual pipeline: pass names, options in braces, named pipelines, and helpful errors."""

from __future__ import annotations

import pytest

from tilefold.errors import PassError
from tilefold.passes import (
    PASSES,
    PIPELINES,
    Canonicalize,
    Pass,
    parse_pipeline,
    register_pass,
    register_pipeline,
)


def names(text: str) -> list[str]:
    return [p.name for p in parse_pipeline(text)]


def test_names_in_order_with_spaces_allowed() -> None:
    assert names("canonicalize,cse, dce ") == ["canonicalize", "cse", "dce"]
    assert names("") == []


def test_named_pipeline_expands_in_place() -> None:
    assert PIPELINES["default"] == "canonicalize,cse,constant-fold,dce"
    assert names("dce,default") == ["dce", "canonicalize", "cse", "constant-fold", "dce"]


def test_options_of_every_type() -> None:
    canon, fold, shapes = parse_pipeline(
        "canonicalize{max-iterations=3 strict-signed-zeros=true},constant-fold{size-limit=64},"
        "shape-inference{bind=batch=8,?seq=128}"
    )
    assert (canon.max_iterations, canon.strict_signed_zeros) == (3, True)
    assert fold.size_limit == 64
    assert shapes.bind == {"batch": 8, "seq": 128}


def test_defaults_and_python_options() -> None:
    assert Canonicalize().max_iterations == 10
    assert Canonicalize(max_iterations=2).max_iterations == 2
    with pytest.raises(PassError, match="has no option 'max_iter'"):
        Canonicalize(max_iter=2)
    with pytest.raises(PassError, match="expected int"):
        Canonicalize(max_iterations="2")


def test_str_spells_changed_options_and_parses_back() -> None:
    text = "canonicalize{strict-signed-zeros=true},cse,shape-inference{bind=b=2,n=3}"
    spelled = ",".join(map(str, parse_pipeline(text)))
    assert spelled == text
    assert ",".join(map(str, parse_pipeline(spelled))) == text


def test_each_parse_gives_fresh_instances() -> None:
    a, b = parse_pipeline("shape-inference"), parse_pipeline("shape-inference")
    assert a[0] is not b[0] and a[0].bind is not b[0].bind


@pytest.mark.parametrize(
    ("text", "message", "caret"),
    [
        ("canonicalize,csee", "unknown pass 'csee' (did you mean 'cse'?)", 13),
        ("cse{foo=1}", "pass 'cse' has no option 'foo' (it takes none)", 4),
        ("constant-fold{size=1}", "has no option 'size' (it has: size-limit)", 14),
        ("constant-fold{size-limit=x}", "constant-fold{size-limit=x}: expected an int", 14),
        ("canonicalize{strict-signed-zeros=yes}", "expected true or false", 13),
        ("shape-inference{bind=batch}", "expected name=size pairs like batch=8", 16),
        ("canonicalize{max-iterations}", "option 'max-iterations' must be written key=value", 13),
        (
            "canonicalize{max-iterations=1 max-iterations=2}",
            "option 'max-iterations' is given twice",
            13,
        ),
        ("default{x=1}", "pipeline 'default' takes no options", 8),
        ("cse,", "expected a pass name after ','", 4),
        ("cse,,dce", "expected a pass name", 4),
        ("cse{size-limit=1", "expected a pass name", 0),
    ],
)
def test_errors_point_into_the_pipeline(text: str, message: str, caret: int) -> None:
    with pytest.raises(PassError) as info:
        parse_pipeline(text)
    first, shown, pointer = info.value.message.splitlines()
    assert message in first
    assert shown == f"  in pipeline: {text}"
    assert pointer == " " * (15 + caret) + "^"


class Noop(Pass):
    name = "test-noop"
    summary = "Does nothing (a test pass)"

    def run_on_function(self, fn) -> None:
        pass


def test_register_pass_and_pipeline() -> None:
    register_pass(Noop)
    try:
        assert PASSES["test-noop"] is Noop
        assert names("test-noop") == ["test-noop"]
        with pytest.raises(PassError, match="registered already"):
            register_pass(Noop)
        register_pipeline("test-cleanup", "test-noop,dce")
        assert names("test-cleanup") == ["test-noop", "dce"]
        with pytest.raises(PassError, match="unknown pass 'nope'"):
            register_pipeline("test-broken", "nope")
        with pytest.raises(PassError, match="lowercase words"):
            register_pipeline("Bad_Name", "dce")
    finally:
        PASSES.pop("test-noop", None)
        PIPELINES.pop("test-cleanup", None)
        PIPELINES.pop("test-broken", None)
