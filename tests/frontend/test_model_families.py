"""More transformer families through torch.compile(backend="tilefold"), strict, against eager.

Encoders (RoBERTa, DistilBERT, ELECTRA, ALBERT), decoders with RoPE and grouped-query
attention (Mistral, Qwen2, Gemma, Phi-3), other decoder layouts (OPT, GPT-NeoX), a vision
transformer and a T5 encoder, each from a small config with random weights. Strict mode: a
graph left to PyTorch, or a kernel falling back, fails the test. Models are also built under
`torch.inference_mode()`, whose weights are inference tensors.
"""

from __future__ import annotations

import pytest
import torch

from tilefold.frontend import report

transformers = pytest.importorskip("transformers")

H, LAYERS, HEADS, FF, VOCAB, POS = 64, 2, 4, 128, 100, 64
ENCODER = {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "intermediate_size": FF, "vocab_size": VOCAB, "max_position_embeddings": POS}
DECODER = {**ENCODER, "num_key_value_heads": 2}


def _config(name: str, **kw):
    return getattr(transformers, name)(**kw)


FAMILIES = {
    "roberta": lambda: transformers.RobertaModel(_config(
        "RobertaConfig", **{**ENCODER, "max_position_embeddings": POS + 2})),
    "distilbert": lambda: transformers.DistilBertModel(_config(
        "DistilBertConfig", dim=H, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FF,
        vocab_size=VOCAB, max_position_embeddings=POS)),
    "electra": lambda: transformers.ElectraModel(_config(
        "ElectraConfig", embedding_size=32, **ENCODER)),
    "albert": lambda: transformers.AlbertModel(_config(
        "AlbertConfig", embedding_size=32, **ENCODER)),
    "mistral": lambda: transformers.MistralModel(_config("MistralConfig", **DECODER)),
    "qwen2": lambda: transformers.Qwen2Model(_config("Qwen2Config", **DECODER)),
    "gemma": lambda: transformers.GemmaModel(_config("GemmaConfig", head_dim=16, **DECODER)),
    "phi3": lambda: transformers.Phi3Model(_config(
        "Phi3Config", pad_token_id=0, **DECODER)),
    "opt": lambda: transformers.OPTModel(_config(
        "OPTConfig", hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        ffn_dim=FF, vocab_size=VOCAB, max_position_embeddings=POS, word_embed_proj_dim=H)),
    "gpt_neox": lambda: transformers.GPTNeoXModel(_config("GPTNeoXConfig", **ENCODER)),
    "t5_encoder": lambda: transformers.T5EncoderModel(_config(
        "T5Config", d_model=H, d_kv=16, d_ff=FF, num_layers=LAYERS, num_heads=HEADS,
        vocab_size=VOCAB)),
}
DECODERS = {"mistral", "qwen2", "gemma", "phi3", "opt", "gpt_neox"}


def _text_inputs(seq: int) -> dict:
    ids = torch.randint(1, VOCAB, (2, seq))
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[-1, seq - 3:] = 0  # a padded sequence
    return {"input_ids": ids, "attention_mask": mask}


def _check(model, inputs: list[dict], extra: dict) -> None:
    torch._dynamo.reset()
    report.REPORTS.clear()
    compiled = torch.compile(model, backend="tilefold", options={"strict": True})
    with torch.no_grad():
        for kwargs in inputs:
            got = compiled(**kwargs, **extra)[0]
            want = model(**kwargs, **extra)[0]
            assert got.shape == want.shape
            assert (got - want).abs().max().item() < 2e-5 * max(1.0, want.abs().max().item())
    graphs = report.reports()
    assert graphs and all(g.mode == "tilefold" for g in graphs), [g.reason for g in graphs]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_eager_in_strict_mode(name):
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    extra = {"use_cache": False} if name in DECODERS else {}
    _check(model, [_text_inputs(9), _text_inputs(12)], extra)


def test_vision_transformer_matches_eager_in_strict_mode():
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=H, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, intermediate_size=FF,
                                    image_size=32, patch_size=8, num_channels=3)
    model = transformers.ViTModel(config).eval()
    _check(model, [{"pixel_values": torch.randn(2, 3, 32, 32)}], {})


@pytest.mark.parametrize("name", ["qwen2", "roberta"])
def test_models_built_under_inference_mode_run(name):
    """Weights made under inference_mode are inference tensors (no version counter)."""
    torch.manual_seed(0)
    with torch.inference_mode():
        model = FAMILIES[name]().eval()
    extra = {"use_cache": False} if name in DECODERS else {}
    _check(model, [_text_inputs(10)], extra)
