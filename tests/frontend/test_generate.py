"""Text generation through torch.compile(backend="tilefold"), strict, against eager.

`model.generate` with the forward compiled, for seven causal-LM families (small configs,
random weights), with both of Hugging Face's KV caches: the dynamic cache grows by a `cat`
along a symbolic length (`?(s0+1)` dims), the static cache is written in place by
`index_put` into a graph input (a donated buffer). Prompts are batches of 4 (and 2, 3),
left-padded by different amounts, one row down to one token. Greedy decoding must pick exactly
eager's tokens; strict mode makes any graph or kernel left to PyTorch a failure; decoding
further must not compile new graphs; the static cache's decode step must write the cache
without a copy.
"""

from __future__ import annotations

import pytest
import torch

from tilefold.frontend import report

transformers = pytest.importorskip("transformers")

H, VOCAB, POS = 64, 100, 64
DECODER = {"hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": VOCAB, "max_position_embeddings": POS,
           "num_key_value_heads": 2}

FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**DECODER)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**DECODER)),
    "phi3": lambda: transformers.Phi3ForCausalLM(
        transformers.Phi3Config(pad_token_id=0, **DECODER)),
    "gemma": lambda: transformers.GemmaForCausalLM(
        transformers.GemmaConfig(head_dim=16, **DECODER)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=H, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=POS)),
    "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
        hidden_size=H, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
        vocab_size=VOCAB, max_position_embeddings=POS, word_embed_proj_dim=H)),
}


def _model(name: str):
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    model.generation_config.pad_token_id = 0
    return model


def _prompt(batch: int, length: int) -> dict:
    ids = torch.randint(1, VOCAB, (batch, length))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # sequences left-padded by different amounts, one of them to one token
    if batch > 2:
        mask[2, :length - 1] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def _generate(model, prompt: dict, cache: str, new_tokens: int) -> torch.Tensor:
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        return model.generate(**prompt, max_new_tokens=new_tokens, do_sample=False, **extra)


def _compile(model, dynamic: bool | None = None) -> None:
    torch._dynamo.reset()
    report.REPORTS.clear()
    model.forward = torch.compile(model.forward, backend="tilefold", dynamic=dynamic,
                                  options={"strict": True})


def _graphs() -> list:
    graphs = report.reports()
    assert graphs and all(g.mode == "tilefold" for g in graphs), [g.reason for g in graphs]
    return graphs


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_greedy_generation_picks_eagers_tokens(name, cache):
    model = _model(name)
    prompt = _prompt(4, 6)
    want = _generate(model, prompt, cache, 8)
    _compile(model)
    got = _generate(model, prompt, cache, 8)
    assert torch.equal(got, want)
    graphs = len(_graphs())
    if cache == "dynamic":  # decoding further reuses the graphs of the symbolic length
        longer = _generate(model, prompt, cache, 16)
        assert len(_graphs()) == graphs
        eager_forward = model.forward._torchdynamo_orig_callable
        model.forward = eager_forward
        assert torch.equal(longer, _generate(model, prompt, cache, 16))


def test_one_token_prompt_and_batch_of_one():
    model = _model("llama")
    prompt = {"input_ids": torch.tensor([[7]])}
    want = _generate(model, prompt, "dynamic", 12)
    _compile(model)
    assert torch.equal(_generate(model, prompt, "dynamic", 12), want)
    _graphs()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_dynamic_from_the_start(name):
    """`dynamic=True` makes every dim symbolic from the first graph (dtype conversions come as
    `prims.convert_element_type`): eager's tokens, at another batch and prompt length too
    (Dynamo may guard on the cache's Python state and trace again: that is its choice)."""
    model = _model(name)
    prompt = _prompt(2, 5)
    want = _generate(model, prompt, "dynamic", 10)
    _compile(model, dynamic=True)
    assert torch.equal(_generate(model, prompt, "dynamic", 10), want)
    other = _prompt(3, 4)
    assert torch.equal(_generate(model, other, "dynamic", 4), _eager(model, other, 4))
    _graphs()


def _eager(model, prompt, new_tokens):
    compiled, model.forward = model.forward, model.forward._torchdynamo_orig_callable
    try:
        return _generate(model, prompt, "dynamic", new_tokens)
    finally:
        model.forward = compiled


def test_static_cache_of_another_length_recompiles_with_a_symbolic_length():
    """A second `generate` with more new tokens makes a longer static cache: Dynamo traces the
    prefill again with `max_cache_len` as a SymInt input that only `torch.zeros` (the cache's
    allocation, in the graph) uses, so no tensor argument's shape holds it; the IR takes it
    as an empty `u8[?s,0]` argument. Unpadded, so no mask carries the length either."""
    torch.manual_seed(3)
    prompt = {"input_ids": torch.randint(1, VOCAB, (1, 5))}
    eager = _model("llama")  # its own model: generate() remembers the longest cache it made
    want = [_generate(eager, prompt, "static", n) for n in (6, 10)]
    model = _model("llama")
    _compile(model)
    for n, tokens in zip((6, 10), want, strict=True):
        assert torch.equal(_generate(model, prompt, "static", n), tokens)
    graphs = _graphs()
    carried = [a for g in graphs for e in g.executors for a in e.runner.function.args
               if a.name.startswith("size_")]
    assert carried and all(a.type.dtype.name == "u8" and a.type.shape[1] == 0 for a in carried)


def test_static_cache_is_written_in_place():
    """The decode step's cache writes (`index_put` into a graph input) land in the cache tensors
    themselves, planned "in place": no copy of the cache per token. Its attention reads them
    as they are, in the decode kernel: Hugging Face's repeat_kv (a copy of the whole cache
    with each key/value head repeated) folds into grouped-query attention."""
    model = _model("llama")
    prompt = _prompt(2, 5)
    _generate(model, prompt, "static", 6)
    _compile(model)
    _generate(model, prompt, "static", 6)
    writes, reads, methods = [], [], []
    for graph in _graphs():
        for runner in (e.runner for e in graph.executors):
            fn, executor = runner.function, runner.run
            plan = executor.compiled.plan_for(*executor.last_shapes)
            writes += [plan.layout.get(fn.outputs[r].name) for r in runner.converted.mutations
                       if fn.outputs[r].defining_op.name == "index_put"]
            reads += [tuple(op.operands[i].defining_op.name for i in (1, 2))
                      for op in executor.compiled.function.ops
                      if op.name == "scaled_dot_product_attention"]
            methods += [d.winner.method for d in plan.decisions]
    assert len(writes) == 4  # keys and values of two layers, in the decode graph
    assert set(writes) == {"in place"}
    # two layers of the prompt's graph and of the decode step's: k and v are the cache writes
    assert reads == [("index_put", "index_put")] * 4
    assert "handwritten.decode_attention" in methods


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_weight_only_generation_picks_the_quantized_models_tokens(fmt):
    """`options={"weights": fmt}` decodes with int8/int4 weights: the tokens are eager's on
    the same model with each linear weight replaced by its dequantized codes (what the
    weight-only GEMM multiplies by), strict, with every linear run weight-only."""
    import numpy as np

    from tilefold.passes.quantize_weights import quantize_weight

    model = _model("llama")
    prompt = _prompt(2, 6)
    fake = _model("llama")
    with torch.no_grad():
        for module in fake.modules():
            # all of them: the k and v projections are small, but merged with q (merge-matmuls)
            # they are one weight big enough to quantize, with the same per-row scales
            if isinstance(module, torch.nn.Linear):
                w = module.weight.numpy()
                codes, scale = quantize_weight(w, 1, fmt)
                step = np.repeat(scale, w.shape[1] // scale.shape[1], axis=1)
                module.weight.copy_(torch.from_numpy(codes.astype(np.float32) * step))
    want = _generate(fake, prompt, "dynamic", 8)
    torch._dynamo.reset()
    report.REPORTS.clear()
    model.forward = torch.compile(model.forward, backend="tilefold",
                                  options={"strict": True, "weights": fmt})
    assert torch.equal(_generate(model, prompt, "dynamic", 8), want)
    gemms = [d.winner.config for g in _graphs() for d in g.decisions()
             if d.winner.method == "blocks.gemm"]
    assert gemms and all(c.get("weights") == ("i8" if fmt == "int8" else "i4") for c in gemms)
