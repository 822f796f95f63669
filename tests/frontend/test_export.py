"""torch.export programs: symbolic batch/sequence dims, saving as IR text, running without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tilefold.errors import ShapeError
from tilefold.frontend import from_exported_program
from tilefold.ir import interpret, parse_file, print_module

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        vocab_size=50, max_position_embeddings=32,
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2, max=32)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    ep = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask},
                             dynamic_shapes=dims)
    module = from_exported_program(ep, dim_names={"input_ids": ("batch", "seq")})
    return model, module


def _inputs(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 50, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq // 2:] = 0  # padding
    return ids, mask


def test_symbolic_dims_run_any_batch_and_sequence(bert):
    model, module = bert
    args = [a.type for a in module["main"].args]
    assert [str(t) for t in args] == ["i64[?batch,?seq]", "i64[?batch,?seq]"]
    for batch, seq in [(2, 7), (3, 12), (1, 5)]:
        ids, mask = _inputs(batch, seq)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask)
        got = interpret(module, ids.numpy(), mask.numpy())
        np.testing.assert_allclose(got[0], want[0].numpy(), atol=2e-5)
        np.testing.assert_allclose(got[1], want[1].numpy(), atol=2e-5)


def test_mismatched_input_is_a_clear_error(bert):
    _, module = bert
    ids, _ = _inputs(2, 7)
    mask = torch.ones(2, 9, dtype=torch.long)
    with pytest.raises(ShapeError, match=r"\?seq is 7 elsewhere but 9 here"):
        interpret(module, ids.numpy(), mask.numpy())


def test_saved_text_reloads_and_runs_without_torch(bert, tmp_path):
    model, module = bert
    text = print_module(module, resource_dir=tmp_path / "weights")
    assert len(text) < 100_000 and 'file "' in text  # weights live in side files
    (tmp_path / "bert.tfir").write_text(text)
    reloaded = parse_file(tmp_path / "bert.tfir", tmp_path / "weights")
    assert print_module(reloaded, resource_dir=tmp_path / "weights") == text
    ids, mask = _inputs(3, 10)
    np.save(tmp_path / "ids.npy", ids.numpy())
    np.save(tmp_path / "mask.npy", mask.numpy())
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # importing torch now fails
        import numpy as np
        from tilefold.ir import interpret, parse_file
        d = {str(tmp_path)!r}
        module = parse_file(d + "/bert.tfir", d + "/weights")
        out = interpret(module, np.load(d + "/ids.npy"), np.load(d + "/mask.npy"))
        np.save(d + "/out.npy", out[0])
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask)[0].numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, atol=2e-5)
