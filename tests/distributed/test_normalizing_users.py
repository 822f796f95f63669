"""Every reader of the `normalizing` trait treats each such op alike, from its `reduced_axes`:
`ir/axes.py` reduces exactly those axes, fusion fuses the op into a row group only when they are
trailing, the sharding rule never splits them, and split-all-reduce runs the op on blocks of a
dim it does not normalize (the result still the reference's, on the simulated mesh)."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.distributed import SplitAllReduce, rule_for, simulate
from tilefold.distributed.rules import LETTERS
from tilefold.ir import OPS, parse_module, verify
from tilefold.ir.axes import AxisClasses
from tilefold.passes.fusion import Fusion

NORMALIZING = sorted(name for name, d in OPS.items() if "normalizing" in d.traits)
CASES = [(name, axis) for name in NORMALIZING for axis in (0, 1, -1)]
SHAPE = (6, 8)


def _weights(name: str, axis: int) -> list[tuple[int, ...]]:
    reduced = OPS[name].reduced_axes(2, OPS[name].full_attrs({"axis": axis}))
    return [tuple(SHAPE[j] for j in reduced)] * (len(OPS[name].operands) - 1)


def _text(name: str, axis: int, placed: bool) -> str:
    t = "f64[6,8]"
    at, partial = (" @m[R]", " @m[P(sum)]") if placed else ("", "")
    ws = _weights(name, axis)
    args = "".join(f", %w{i}: f64[{','.join(map(str, s))}]{at}" for i, s in enumerate(ws))
    uses = "".join(f", %w{i}" for i in range(len(ws)))
    first = (f'  %s = all_reduce(%p) {{axis = "tp"}} : {t}{at}\n' if placed else
             f"  %s = add(%p, %p) : {t}\n")
    return (("mesh @m [tp=2]\n" if placed else "")
            + f"func @main(%p: {t}{partial}{args}) -> ({t}{at}) {{\n" + first
            + f"  %n = {name}(%s{uses}) {{axis = {axis}}} : {t}{at}\n  return(%n)\n}}")


def _op(module, name: str):
    return next(op for op in module["main"].walk() if op.name == name)


@pytest.mark.parametrize(("name", "axis"), CASES)
def test_axes_fusion_and_sharding_read_the_reduced_axes(name: str, axis: int) -> None:
    module = verify(parse_module(_text(name, axis, placed=False)))
    op = _op(module, name)
    reduced = op.reduced_axes()
    assert AxisClasses().align(op) == {(op.operands[0], j) for j in reduced}
    assert set(rule_for(op).fixed) == {LETTERS[j] for j in reduced}
    fusion = Fusion()
    fusion.run(module)
    fused = [o for o in module["main"].ops if o.name == "fused"]
    if reduced == tuple(range(reduced[0], 2)):  # trailing: the add and the op are one group
        assert len(fused) == 1 and _op(module, name).parent is fused[0].regions[0]
    else:
        assert len(fused) == 2
        assert any("not trailing axes" in r.reason for r in fusion.refusals)


@pytest.mark.parametrize(("name", "axis"), CASES)
def test_split_all_reduce_runs_the_op_on_a_dim_it_does_not_normalize(name: str,
                                                                      axis: int) -> None:
    module = verify(parse_module(_text(name, axis, placed=True)))
    reduced = _op(module, name).reduced_axes()
    split = SplitAllReduce()
    split.run(module)
    verify(module)
    kinds = [o.name for o in module["main"].ops if o.has_trait("collective")]
    if len(reduced) == len(SHAPE):  # every dim normalized: nothing to run on a block
        assert kinds == ["all_reduce"] and split.stats["num-split"] == 0
    else:
        scatter = _op(module, "reduce_scatter")
        assert kinds == ["reduce_scatter", "all_gather"]
        assert scatter.attr("dim") not in reduced
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=SHAPE), *(rng.normal(size=s) for s in _weights(name, axis))]
    opdef = OPS[name]
    want = opdef.reference(arrays, opdef.full_attrs({"axis": axis}))
    (got,) = simulate(module, *arrays, rng=rng)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
