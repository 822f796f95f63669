"""PyTorch models exported as artifacts: the demo's MiniLM (real weights, a `torch.nn.Module`)
and a small GPT-2 (random weights, an `ExportedProgram` with a symbolic sequence length,
exported again at the example inputs' static shapes). The loaded artifact computes bit for
bit what `tilefold.compile` computes of the same Module, close to eager PyTorch, and runs in
a new process without torch or LLVM."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tilefold
from tests.aot.test_loader_imports import run_fresh
from tilefold.artifact.format import MANIFEST, PROGRAM
from tilefold.cli import models
from tilefold.errors import UnsupportedError
from tilefold.frontend.aot_export import torch_module

transformers = pytest.importorskip("transformers")

# Eager PyTorch sums in another order than tilefold's kernels: float32 rounding apart. MiniLM's
# embeddings are unit vectors (elements ~0.05), GPT-2's hidden states ~1.
EAGER_ATOL = {"minilm": 2e-5, "gpt2": 1e-4}


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]


def _tokens(vocab: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq // 2:] = 0  # a padded sequence: the mask reaches the attention
    return ids, mask


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    torch.manual_seed(0)
    model, _ = models.load_model("minilm", None)
    example = _tokens(models.VOCAB["minilm"], 2, 16, seed=1)
    path = tilefold.export(model, example, tmp_path_factory.mktemp("minilm") / "minilm.tfa")
    module, _, _ = torch_module(model, example)  # what export compiles: the same Module
    return model, module, path


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97,
                                     n_positions=64, use_cache=False)
    model = LastHidden(transformers.GPT2Model(config)).eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(model, _tokens(97, 2, 8, seed=1),
                                  dynamic_shapes=({1: seq}, {1: seq}))
    example = _tokens(97, 2, 12, seed=2)  # ?seq is 12 here (the batch was exported static)
    module, _, _ = torch_module(program, example)
    assert all(isinstance(d, int) for a in module["main"].args for d in a.type.shape)
    path = tilefold.export(program, example, tmp_path_factory.mktemp("gpt2") / "gpt2.tfa")
    return model, module, path


@pytest.mark.parametrize("name", ["minilm", "gpt2"])
def test_a_torch_model_exports_and_loads_bit_for_bit(name: str, request) -> None:
    model, module, path = request.getfixturevalue(name)
    manifest = json.loads((path / MANIFEST).read_text())
    shape = [2, 16] if name == "minilm" else [2, 12]
    assert [i["shape"] for i in manifest["inputs"]] == [shape, shape]
    assert [i["dtype"] for i in manifest["inputs"]] == ["i64", "i64"]
    loaded, compiled = tilefold.load(path), tilefold.compile(module)
    vocab = models.VOCAB["minilm"] if name == "minilm" else 97
    kinds = [b["kind"] for b in json.loads((path / PROGRAM).read_text())["buffers"]]
    previous = None
    for seed in (3, 4):  # tokens other than the exporter's
        ids, mask = (t.numpy() for t in _tokens(vocab, *shape, seed=seed))
        for kind, buffer in zip(kinds, loaded.buffers, strict=True):
            if kind == "workspace":  # shared by lifetime: NaN bytes there change nothing
                buffer[:] = 0xFF
        (got,) = loaded(ids, mask)
        (want,) = compiled(ids, mask)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        with torch.no_grad():
            eager = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(got, eager, rtol=0, atol=EAGER_ATOL[name])
        assert previous is None or not np.array_equal(got, previous)
        previous = got


def test_minilm_runs_in_a_new_process_without_torch_or_llvm(minilm, tmp_path) -> None:
    _, module, path = minilm
    ids, mask = (t.numpy() for t in _tokens(models.VOCAB["minilm"], 2, 16, seed=5))
    said, got = run_fresh(path, [ids, mask], tmp_path)
    assert "imported: [] []" in said, said
    (want,) = tilefold.compile(module)(ids, mask)
    assert len(got) == 1 and got[0].tobytes() == want.tobytes()


def test_the_weights_are_in_the_data_file(gpt2) -> None:
    model, _, path = gpt2
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    data = json.loads((path / MANIFEST).read_text())["parts"]["data"]["bytes"]
    assert data >= weights * 0.9  # the embedding tables and projections, some packed


def test_an_example_input_that_is_not_a_tensor_is_refused(tmp_path) -> None:
    model = torch.nn.Linear(4, 4)
    with pytest.raises(UnsupportedError, match="example input 1 is a int"):
        tilefold.export(model, [torch.zeros(2, 4), 3], tmp_path / "out.tfa")
    assert not (tmp_path / "out.tfa").exists()


def test_a_model_torch_export_cannot_export_is_refused_naming_it(tmp_path) -> None:
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # control flow on the values

    with pytest.raises(UnsupportedError, match=r"torch\.export could not export DataDependent"):
        tilefold.export(DataDependent(), [torch.randn(8)], tmp_path / "out.tfa")
