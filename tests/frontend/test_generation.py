"""`Generator`: prefill + a decode loop over the compiled forward on a static cache, strict.

Greedy tokens must be Hugging Face `generate`'s (eager, same weights), also once the loop calls
the decode graph directly (after its first steps); a second generation reuses the compiled
graphs (no new trace); the decode step's graph replays as one native call (every step native:
index arithmetic, cache row writes, gathers, concatenations included)."""

from __future__ import annotations

import pytest
import torch

from tilefold.errors import ShapeError
from tilefold.frontend import report
from tilefold.frontend.generation import Generator

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=100, max_position_embeddings=64)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=100, max_position_embeddings=64)),
}


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    report.REPORTS.clear()


def _eager(model, prompt, new_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_greedy_tokens_are_hugging_faces(name):
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    generator = Generator(model, max_length=40, options={"strict": True})
    for prompt, new in (([5, 7, 9, 11], 12), ([3] * 9 + [42], 7)):
        got = generator(prompt, new)
        assert got.tokens == _eager(model, prompt, new)
        assert got.prefill_s > 0 and got.decode_tokens_per_s > 0
    graphs = len(report.reports())
    generator([5, 7, 9, 11], 12)
    assert len(report.reports()) == graphs  # no new graph for a generation like an earlier one


def test_the_decode_step_replays_as_one_native_call():
    torch.manual_seed(0)
    model = FAMILIES["llama"]().eval()
    generator = Generator(model, max_length=32, options={"strict": True})
    generator([5, 7, 9, 11], 6)
    assert generator._direct is not None  # later steps call the graph, not torch.compile
    decode = [plan for graph in report.reports() for e in graph.executors
              for plan in e.runner.run.compiled._plans.values() if plan.replay is not None]
    assert decode, "the decode step never replayed"
    for plan in decode:
        assert plan.replay.native_steps == len(plan.steps)
        assert len(plan.replay.segments) == 1


def test_generation_beyond_the_cache_is_refused():
    model = FAMILIES["llama"]().eval()
    generator = Generator(model, max_length=8, backend="eager")
    with pytest.raises(ShapeError, match="max_length"):
        generator([1, 2, 3, 4, 5], 4)
    with pytest.raises(ShapeError, match="max_length"):
        generator([], 1)


def test_a_profile_times_every_step_of_the_decode_graph_and_keeps_the_tokens():
    """`Generator.profile` runs the decode graph's steps one by one, each timed: one profiled
    call a decoded token, every step of the plan labelled (the decode attention kernel and the
    GEMVs among them), and the tokens are those of an unprofiled generation."""
    torch.manual_seed(0)
    model = FAMILIES["llama"]().eval()
    generator = Generator(model, max_length=32, options={"strict": True})
    want = generator([5, 7, 9, 11], 9).tokens
    times = generator.profile([5, 7, 9, 11], 9)
    assert times.calls == 8  # the steps after the prompt's token
    rows = times.per_call()
    graph = generator._direct[0].runner.runner.run.compiled  # the decode step's graph
    assert graph.profiling is None
    (plan,) = graph._plans.values()
    assert sum(count for _, _, count in rows) == len(plan.steps) == len(plan.labels)
    labels = " ".join(label for label, _, _ in rows)
    assert "handwritten.decode_attention: scaled_dot_product_attention" in labels
    assert "blocks.gemm: matmul" in labels
    assert all(seconds > 0 for _, seconds, _ in rows)
    assert generator([5, 7, 9, 11], 9).tokens == want
