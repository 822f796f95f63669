"""Facts declared on the ops agree with what the ops mean: a reduction's `reduced_axes` with its
reference, the `normalizing` trait with row-by-row results, and every view (`OpDef.view`, the
one table `tilefold.ir.ops.VIEWS`) with its NumPy reference and with torch, on random shapes,
strided and transposed inputs included."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tolerances import tolerance
from tilefold.ir import OPS
from tilefold.ir.ops import VIEWS

REDUCTIONS = sorted(name for name, d in OPS.items() if "reduction" in d.traits)
NORMALIZING = sorted(name for name, d in OPS.items() if "normalizing" in d.traits)


def reference(name: str, args: list[np.ndarray], attrs: dict) -> np.ndarray:
    opdef = OPS[name]
    return opdef.reference(args, opdef.full_attrs(opdef.check_signature(len(args), attrs)))


def test_the_normalizing_ops_are_the_row_norms() -> None:
    assert NORMALIZING == ["layer_norm", "log_softmax", "rms_norm", "softmax"]
    assert set(NORMALIZING) <= set(REDUCTIONS)


@pytest.mark.parametrize("name", sorted(set(REDUCTIONS) - set(NORMALIZING)))
@pytest.mark.parametrize("axes", [None, (0,), (-1,), (0, 2), (2, 1)])
def test_reduced_axes_are_the_ones_keepdims_keeps_as_one(name: str, axes) -> None:
    x = np.random.default_rng(1).standard_normal((3, 4, 5))
    got = OPS[name].reduced_axes(3, {"axes": axes, "keepdims": True})
    shape = reference(name, [x], {"axes": axes, "keepdims": True}).shape
    assert got == tuple(sorted(got)) and got == tuple(j for j in range(3) if shape[j] == 1)


@pytest.mark.parametrize("name", NORMALIZING)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_a_normalizing_op_normalizes_each_row_on_its_own(name: str, axis: int) -> None:
    """Its result has the operand's shape, its further operands the shape of the reduced axes
    (trailing ones: the affine weights), and cutting the operand on any other axis cuts the
    result alike (rows are independent), while cutting a reduced axis changes the result."""
    rng = np.random.default_rng(2 + axis)
    shape = (4, 5, 6)
    reduced = OPS[name].reduced_axes(3, OPS[name].full_attrs({"axis": axis}))
    assert reduced and reduced == tuple(sorted(reduced))
    x = rng.standard_normal(shape)
    weights = [rng.standard_normal([shape[j] for j in reduced])
               for _ in OPS[name].operands[1:]]
    full = reference(name, [x, *weights], {"axis": axis})
    assert full.shape == shape
    for j in range(3):
        cut = tuple(slice(0, 2) if k == j else slice(None) for k in range(3))
        cut_weights = [w[cut[reduced[0]:]] for w in weights]  # they index the reduced axes
        part = reference(name, [x[cut], *cut_weights], {"axis": axis})
        same = np.allclose(part, full[cut], **tolerance("f64", x.size))
        assert same == (j not in reduced), (j, reduced)


def _strided(rng, shape: tuple[int, ...], how: str) -> np.ndarray:
    """A random f32 array of `shape`: contiguous, every other element of a wider one, or the
    transpose of a contiguous array."""
    if how == "strided":
        return rng.standard_normal((*shape[:-1], 2 * shape[-1])).astype(np.float32)[..., ::2]
    if how == "transposed":
        return rng.standard_normal(shape[::-1]).astype(np.float32).T
    return rng.standard_normal(shape).astype(np.float32)


def _random_view(name: str, rng) -> tuple[tuple[int, ...], dict]:
    """A random operand shape and attributes for view op `name`."""
    rank = int(rng.integers(1, 4))
    shape = tuple(int(d) for d in rng.integers(1, 6, rank))
    if name == "reshape":
        return shape, {"shape": (int(np.prod(shape)),) if rng.integers(2) else (-1, shape[-1])}
    if name == "transpose":
        return shape, {"perm": tuple(int(p) for p in rng.permutation(rank))}
    if name == "expand_dims":
        count = int(rng.integers(1, 3))
        axes = rng.choice(rank + count, count, replace=False)
        return shape, {"axes": tuple(int(a) - (rank + count) * int(rng.integers(2))
                                     for a in axes)}
    if name == "squeeze":
        shape = tuple(1 if rng.integers(2) else d for d in shape)
        ones = [j for j, d in enumerate(shape) if d == 1]
        return shape, {"axes": tuple(j - rank * int(rng.integers(2)) for j in ones
                                     if rng.integers(2))}
    if name == "broadcast_to":
        shape = tuple(1 if rng.integers(2) else d for d in shape)
        lead = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(0, 2))))
        return shape, {"shape": lead + tuple(int(rng.integers(2, 5)) if d == 1 else d
                                             for d in shape)}
    assert name == "slice", f"add a random case for the view op {name!r}"
    starts, stops, steps = [], [], []
    for d in shape:
        start = int(rng.integers(0, d))
        starts.append(start)
        stops.append(int(rng.integers(start, d + 1)))
        steps.append(int(rng.integers(1, 3)))
    return shape, {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)}


def test_the_view_table_is_every_op_that_declares_a_view() -> None:
    assert set(VIEWS) == {"reshape", "transpose", "expand_dims", "squeeze", "broadcast_to",
                          "slice"}
    assert all("layout" in OPS[name].traits for name in VIEWS)


@pytest.mark.parametrize("name", sorted(VIEWS))
@pytest.mark.parametrize("how", ["contiguous", "strided", "transposed"])
@pytest.mark.parametrize("seed", range(8))
def test_each_view_is_its_reference_on_numpy_and_torch(name: str, how: str, seed: int) -> None:
    """The view has the shape `infer` gives and the values of NumPy's own function (the
    reference); on a torch tensor it has the same values, and shares the operand's memory
    wherever the NumPy view does."""
    torch = pytest.importorskip("torch")
    from tilefold.ir.types import TensorType

    rng = np.random.default_rng(seed)
    shape, attrs = _random_view(name, rng)
    x = _strided(rng, shape, how)
    opdef = OPS[name]
    attrs = opdef.full_attrs(opdef.check_signature(1, attrs))
    (want_type,) = opdef.infer([TensorType(shape, "f32")], attrs)
    got = VIEWS[name](x, attrs)
    assert got.shape == tuple(want_type.shape)
    np.testing.assert_array_equal(got, NUMPY_MEANING[name](x, attrs))
    t = torch.from_numpy(x)
    on_torch = VIEWS[name](t, attrs)
    assert tuple(on_torch.shape) == got.shape
    np.testing.assert_array_equal(on_torch.numpy(), got)
    if np.may_share_memory(got, x) and got.size:
        assert on_torch.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


NUMPY_MEANING = {  # NumPy's own functions, as tilefold's views were written before the table
    "reshape": lambda x, a: np.reshape(x, a["shape"]),
    "transpose": lambda x, a: np.transpose(x, a["perm"]),
    "expand_dims": lambda x, a: np.expand_dims(x, a["axes"]),
    "squeeze": lambda x, a: np.squeeze(x, a["axes"]),
    "broadcast_to": lambda x, a: np.broadcast_to(x, a["shape"]),
    "slice": lambda x, a: x[tuple(map(slice, a["starts"], a["stops"], a["steps"]))],
}


def test_a_view_of_something_else_says_what_it_takes() -> None:
    from tilefold.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="NumPy arrays and torch tensors"):
        VIEWS["transpose"]([[1.0, 2.0]], {"perm": (1, 0)})
