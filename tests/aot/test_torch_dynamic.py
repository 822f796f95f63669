"""PyTorch models exported with torch.export's `dynamic_shapes` (`Dim`s with bounds): the
artifact's manifest lists each `Dim` and its bounds, and both loaders (`tilefold.load` and the
C runtime) run it at any size within them, bit for bit what `tilefold.compile` gives of the
same Module at that size: a LLaMA-style block (symbolic sequence) and a small BERT (its
padding mask and position ids indexed by a symbolic `arange`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tilefold
from tests.aot.test_symbolic import c_program
from tests.aot.test_torch_models import LastHidden
from tests.distributed.torch_blocks import model_and_input
from tilefold.artifact.format import DTYPES, MANIFEST
from tilefold.errors import ShapeError, UnsupportedError
from tilefold.frontend.aot_export import torch_module

transformers = pytest.importorskip("transformers")
Dim = torch.export.Dim

SEQ = 40  # the sequence bound: sizes 1, primes, the bound
SIZES = [1, 2, 3, 7, 13, 31, 37, SEQ, 5, 1]


def _bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100,
                                     max_position_embeddings=64)
    return LastHidden(transformers.BertModel(config)).eval()


def _tokens(batch: int, seq: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, (seq + 1) // 2:] = 0  # a padded sequence
    return [rng.integers(0, 100, (batch, seq)), mask]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model, x = model_and_input("llama", batch=1)
    dynamic = {"x": {1: Dim("seq", max=SEQ)}}
    path = tilefold.export(model, [x], tmp_path_factory.mktemp("llama") / "llama.tfa",
                           dynamic_shapes=dynamic)
    module, _, bounds = torch_module(model, [x], dynamic)
    assert bounds == {"seq": (1, SEQ)}
    return model, module, path


def _exported_bert(tmp_path_factory, dims: dict[int, object], batch: int, seq: int):
    """The BERT exported with `dims` symbolic in both inputs, from example tokens of this
    shape; (model, the Module tilefold compiles, the artifact)."""
    model = _bert()
    dynamic = {"input_ids": dims, "attention_mask": dims}
    example = [torch.from_numpy(a) for a in _tokens(batch, seq, seed=1)]
    path = tilefold.export(model, example, tmp_path_factory.mktemp("bert") / "bert.tfa",
                           dynamic_shapes=dynamic)
    module, _, _ = torch_module(model, example, dynamic)
    return model, module, path


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return _exported_bert(tmp_path_factory, {1: Dim("seq", max=SEQ)}, 2, 16)


def test_the_manifest_lists_the_dims_and_their_bounds(llama, bert) -> None:
    for (_, _, path), shapes in ((llama, [[1, "?seq", 64]]), (bert, [[2, "?seq"]] * 2)):
        manifest = json.loads((path / MANIFEST).read_text())
        assert manifest["symbols"] == {"seq": {"min": 1, "max": SEQ}}
        assert [i["shape"] for i in manifest["inputs"]] == shapes
        assert len(manifest["size_classes"]) <= 4  # sizes share classes, not one each


def test_a_llama_style_block_at_any_length(llama, tmp_path) -> None:
    model, module, path = llama
    loaded, compiled = tilefold.load(path), tilefold.compile(module)
    groups = []
    for i, n in enumerate(SIZES):
        x = np.random.default_rng(i).standard_normal((1, n, 64)).astype(np.float32)
        (got,), (want,) = loaded(x), compiled(x)
        assert got.shape == (1, n, 64) and got.tobytes() == want.tobytes(), n
        with torch.no_grad():
            eager = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, eager, rtol=0, atol=1e-4)
        groups.append(([x], got))
    with pytest.raises(ShapeError, match=r"\?seq = 41 is not a size"):
        loaded(np.zeros((1, SEQ + 1, 64), np.float32))
    _check_c(path, groups, tmp_path)


def test_a_bert_at_any_length(bert, tmp_path) -> None:
    model, module, path = bert
    loaded, compiled = tilefold.load(path), tilefold.compile(module)
    groups = []
    for i, n in enumerate(SIZES):
        ids, mask = _tokens(2, n, seed=10 + i)
        (got,), (want,) = loaded(ids, mask), compiled(ids, mask)
        assert got.shape == (2, n, 64) and got.tobytes() == want.tobytes(), n
        with torch.no_grad():
            eager = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(got, eager, rtol=0, atol=2e-5)
        groups.append(([ids, mask], got))
    _check_c(path, groups, tmp_path)


def _check_c(path, groups: list[tuple[list[np.ndarray], np.ndarray]], tmp_path) -> None:
    """The C runtime (tests/aot/run_model.c) over every group in one process: bit for bit."""
    import subprocess

    binary = c_program(path, tmp_path)
    argv, files = [], []
    for g, (xs, want) in enumerate(groups):
        argv += ["--"] if g else []
        for i, x in enumerate(xs):
            x.tofile(tmp_path / f"in{g}-{i}.bin")
            code = list(DTYPES).index("i64" if x.dtype == np.int64 else "f32")
            argv.append(f"i:{code}:{','.join(map(str, x.shape))}:{tmp_path / f'in{g}-{i}.bin'}")
        files.append(tmp_path / f"out{g}.bin")
        argv.append(f"o:{list(DTYPES).index('f32')}:{','.join(map(str, want.shape))}:"
                    f"{files[-1]}")
    done = subprocess.run([str(binary), str(path), *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.stdout, done.stderr)
    for f, (_, want) in zip(files, groups, strict=True):
        assert f.read_bytes() == want.tobytes(), f


def test_an_exported_program_takes_dims_by_position(tmp_path) -> None:
    """An `ExportedProgram` (here with dims of its own) given `dynamic_shapes` by position is
    exported again from its module with them: the artifact's dim is the new `Dim`."""
    model, x = model_and_input("llama", batch=1)
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {1: Dim("s", min=2)}})
    dynamic = ({1: Dim("length", max=9)},)  # the example has 8 rows
    path = tilefold.export(program, [x], tmp_path / "p.tfa", dynamic_shapes=dynamic)
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["symbols"] == {"length": {"min": 1, "max": 9}}
    assert manifest["inputs"][0]["shape"] == [1, "?length", 64]
    module, _, _ = torch_module(program, [x], dynamic)
    for n in (1, 9):
        xs = np.random.default_rng(n).standard_normal((1, n, 64)).astype(np.float32)
        assert tilefold.load(path)(xs)[0].tobytes() == tilefold.compile(module)(xs)[0].tobytes()


def test_a_dim_without_an_upper_bound_is_refused(tmp_path) -> None:
    model, x = model_and_input("llama", batch=2)
    with pytest.raises(UnsupportedError, match=r"no upper bound.*Dim\('s\d+', max="):
        tilefold.export(model, [x], tmp_path / "t.tfa",
                        dynamic_shapes={"x": {1: Dim.DYNAMIC}})
    assert not (tmp_path / "t.tfa").exists()


def test_dynamic_shapes_torch_refuses_name_the_model(tmp_path) -> None:
    model, x = model_and_input("llama", batch=1)  # a batch of 1 specializes
    with pytest.raises(UnsupportedError, match=r"torch\.export could not export LlamaBlock"):
        tilefold.export(model, [x], tmp_path / "t.tfa",
                        dynamic_shapes={"x": {0: Dim("b", max=4)}})


PAIRS = [(1, 1), (2, 5), (3, 9), (1, 7), (3, 1), (2, 2), (1, 1)]  # (batch, seq)


@pytest.fixture(scope="module")
def bert_batch_and_seq(tmp_path_factory):
    """Batch and sequence both symbolic: each class fits the sequence (the longer range) at
    one batch size."""
    return _exported_bert(tmp_path_factory, {0: Dim("batch", max=3), 1: Dim("seq", max=9)},
                          2, 8)


def test_batch_and_sequence_both_symbolic(bert_batch_and_seq, tmp_path) -> None:
    model, module, path = bert_batch_and_seq
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["symbols"] == {"batch": {"min": 1, "max": 3}, "seq": {"min": 1, "max": 9}}
    assert [i["shape"] for i in manifest["inputs"]] == [["?batch", "?seq"]] * 2
    assert {c[2]["batch"] for c in manifest["size_classes"]} == {1, 2, 3}
    loaded, compiled = tilefold.load(path), tilefold.compile(module)
    groups = []
    for i, (b, n) in enumerate(PAIRS):
        ids, mask = _tokens(b, n, seed=20 + i)
        (got,), (want,) = loaded(ids, mask), compiled(ids, mask)
        assert got.shape == (b, n, 64) and got.tobytes() == want.tobytes(), (b, n)
        with torch.no_grad():
            eager = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(got, eager, rtol=0, atol=2e-5)
        groups.append(([ids, mask], got))
    _check_c(path, groups, tmp_path)
    with pytest.raises(ShapeError, match=r"\?batch = 4 is not a size .*\(1 to 3\)"):
        loaded(*_tokens(4, 3, seed=0))
    with pytest.raises(ShapeError, match=r"\?batch is 2 in one input and 3"):
        loaded(_tokens(2, 3, seed=0)[0], _tokens(3, 3, seed=0)[1])
    with pytest.raises(ShapeError, match=r"\?seq = 10 is not a size .*\(1 to 9\)"):
        loaded(*_tokens(1, 10, seed=0))


def test_the_c_runtime_refuses_a_batch_outside_its_bounds(bert_batch_and_seq, tmp_path) -> None:
    import subprocess

    _, _, path = bert_batch_and_seq
    binary = c_program(path, tmp_path)
    i64 = list(DTYPES).index("i64")
    argv = []
    for k, a in enumerate(_tokens(4, 3, seed=0)):
        a.tofile(tmp_path / f"in{k}.bin")
        argv.append(f"i:{i64}:4,3:{tmp_path / f'in{k}.bin'}")
    argv.append(f"o:{list(DTYPES).index('f32')}:4,3,64:{tmp_path / 'out.bin'}")
    done = subprocess.run([str(binary), str(path), *argv], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.strip() == "run 4 ?batch = 4 is outside the sizes this artifact was " \
        "exported for (1 to 3)", (done.stdout, done.stderr)
