"""The op table itself: every declaration is complete, and every core op has reference tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ir_strategies import CORE_OPS

from tilefold.ir import OPS, Attr, OpDef

HERE = Path(__file__).parent


@pytest.mark.parametrize("name", sorted(OPS))
def test_declaration_is_complete(name: str) -> None:
    op = OPS[name]
    assert op.name == name and issubclass(op, OpDef)
    assert (op.__doc__ or "").strip(), f"{name} needs a docstring saying what it means"
    for hooks in (("infer", "infer_op"), ("reference", "reference_op")):
        if hooks[0] == "reference" and "terminator" in op.traits:
            continue
        declared = [getattr(op, h).__func__ is not getattr(OpDef, h).__func__ for h in hooks]
        assert any(declared), f"{name} must declare {' or '.join(hooks)}()"
    variadic = [i for i, operand in enumerate(op.operands) if operand.startswith("*")]
    assert variadic in ([], [len(op.operands) - 1]), "only the last operand may be variadic"
    assert len(set(op.operands)) == len(op.operands)
    for key, spec in op.attributes.items():
        assert isinstance(spec, Attr) and re.fullmatch(r"[a-z_]+", key)
        if not spec.required and spec.default is not None:
            assert spec.normalize(spec.default) == spec.default, f"{name}.{key} default"


def test_every_core_op_has_reference_tests() -> None:
    sources = "".join(path.read_text() for path in HERE.glob("test_ir_ops_*.py"))
    untested = [name for name in CORE_OPS if f'"{name}"' not in sources]
    assert not untested, f"no reference test names these ops: {untested}"
    assert len(CORE_OPS) >= 45
