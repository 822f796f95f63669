"""The multi-tensor kernel (`codegen/kernel/multi.py`): one table call runs a chain over
tensors of many lengths (short ones whole on one thread, long ones split), in place."""

from __future__ import annotations

import numpy as np

from tilefold.codegen.kernel.multi import SPLIT_ELEMENTS, MultiTensorGroup
from tilefold.ir import parse_module
from tilefold.passes import PassManager

SIZES = (1, 5, 7, 97, SPLIT_ELEMENTS + 13)


def _sgd_momentum():
    """An SGD-with-momentum update over each size (parameter, momentum), after fusion and
    horizontal fusion: the function and its one multi-member region."""
    args = ", ".join(f"%p{i}: f32[{n}], %g{i}: f32[{n}], %b{i}: f32[{n}]"
                     for i, n in enumerate(SIZES))
    results = ", ".join(f"f32[{n}], f32[{n}]" for n in SIZES)
    body = "\n".join(
        f"  %m{i} = mul(%b{i}, %mu) : f32[{n}]\n"
        f"  %v{i} = add(%m{i}, %g{i}) : f32[{n}]\n"
        f"  %s{i} = mul(%v{i}, %lr) : f32[{n}]\n"
        f"  %q{i} = sub(%p{i}, %s{i}) : f32[{n}]"
        for i, n in enumerate(SIZES))
    outs = ", ".join(f"%q{i}, %v{i}" for i in range(len(SIZES)))
    module = parse_module(f"func @main({args}, %lr: f32[], %mu: f32[]) -> ({results}) {{\n"
                          f"{body}\n  return({outs})\n}}\n")
    PassManager("fusion,horizontal-fusion").run(module)
    fn = module["main"]
    (op,) = [o for o in fn.ops if o.name == "fused"]
    return fn, op


def test_table_call_in_place_matches_numpy() -> None:
    fn, op = _sgd_momentum()
    assert op.attr("members") == len(SIZES)
    rng = np.random.default_rng(0)
    arrays = {a.name: rng.standard_normal(a.type.shape).astype(np.float32) for a in fn.args}
    want = {}
    for i in range(len(SIZES)):
        p, g, b = (arrays[f"{x}{i}"].astype(np.float64) for x in "pgb")
        v = b * arrays["mu"] + g
        want[f"p{i}"], want[f"b{i}"] = p - v * arrays["lr"], v
    # the results written over the parameters and momenta: the update in place
    returned = fn.ops[-1].operands
    over = [f"{'p' if returned.index(r) % 2 == 0 else 'b'}{returned.index(r) // 2}"
            for r in op.results]
    inputs = [arrays[v.name] for v in op.operands]
    outputs = [arrays[name] for name in over]
    group = MultiTensorGroup(op.regions[0], op.attr("members"))
    calls = group.calls(*inputs, *outputs)  # nothing run yet
    # a table call per kernel layout (a one-element tensor's may differ), every tensor a row
    tables = [call.keep[0] for call in calls]
    assert len(calls) <= 2 and sum(map(len, tables)) == len(SIZES)
    assert sum((t[:, -1] == -1).sum() for t in tables) == 1  # the long one split
    for call in calls:
        call()
    for name in over:
        np.testing.assert_allclose(arrays[name], want[name], rtol=2e-6, atol=1e-6,
                                   err_msg=name)


def test_repeated_calls_take_each_calls_arrays() -> None:
    """The tables are laid out once per shapes: a second call on other arrays of the same
    shapes (an optimizer's next step) reads and writes those, and strided inputs are read
    through contiguous copies."""
    fn, op = _sgd_momentum()
    group = MultiTensorGroup(op.regions[0], op.attr("members"))
    returned = fn.ops[-1].operands
    over = [f"{'p' if returned.index(r) % 2 == 0 else 'b'}{returned.index(r) // 2}"
            for r in op.results]
    rng = np.random.default_rng(1)
    for strided in (False, False, True):
        arrays = {}
        for a in fn.args:
            n = a.type.shape
            x = rng.standard_normal((2 * n[0],) if strided and n else n).astype(np.float32)
            arrays[a.name] = x[::2] if strided and n else x
        outputs = [np.empty(arrays[name].shape, np.float32) for name in over]
        for call in group.calls(*[arrays[v.name] for v in op.operands], *outputs):
            call()
        for name, got in zip(over, outputs, strict=True):
            i = int(name[1:])
            p, g, b = (arrays[f"{x}{i}"].astype(np.float64) for x in "pgb")
            v = b * arrays["mu"] + g
            np.testing.assert_allclose(got, p - v * arrays["lr"] if name[0] == "p" else v,
                                       rtol=2e-6, atol=1e-6, err_msg=name)
