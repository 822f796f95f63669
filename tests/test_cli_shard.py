"""`tilefold shard`: the plan it prints parses back, the partitioned IR parses and verifies,
the cost table ends in a total; edited plans load; bad sizes and meshes are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilefold.cli.main import main
from tilefold.distributed import BlockShape, Plan, llama, parse_mesh, search
from tilefold.ir import parse_file, parse_module, print_module, verify

EXAMPLE = Path(__file__).parent.parent / "examples" / "llama_block.tfir"


def sections(out: str) -> dict[str, str]:
    """The output cut at its `# plan`, `# partitioned IR` and `# cost` headers."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        for head in ("# plan", "# partitioned IR", "# cost", "# peak memory"):
            if line.startswith(head):
                current = head
                parts[current] = [line] if head == "# peak memory" else []
                break
        else:
            parts[current].append(line)
    return {k: "\n".join(v).strip() + "\n" for k, v in parts.items()}


def test_the_example_is_the_llama_block_the_planner_builds() -> None:
    shape = BlockShape(d=4096, heads=32, kv_heads=8, ffn=14336, batch=1, seq=2048,
                       dtype="bf16")
    assert print_module(parse_file(str(EXAMPLE))) == print_module(llama(shape))


@pytest.mark.parametrize("strategy, collectives", [
    ("megatron", {"all_reduce": 2}), ("megatron-sp", {"all_gather": 2, "reduce_scatter": 2})])
def test_shard_prints_plan_partitioned_ir_and_costs(strategy, collectives, capsys) -> None:
    assert main(["shard", str(EXAMPLE), "--mesh", "tp=8", "--strategy", strategy,
                 "--training"]) == 0
    out = sections(capsys.readouterr().out)
    plan = Plan.parse(out["# plan"])
    module = parse_file(str(EXAMPLE))
    assert plan == search(module, parse_mesh("tp=8"), strategy)
    partitioned = verify(parse_module(out["# partitioned IR"]))
    names = [op.name for op in partitioned["main"].ops]
    assert {c: names.count(c) for c in collectives} == collectives
    assert print_module(partitioned) == print_module(plan.apply(module))
    table = out["# cost"].splitlines()
    assert table[0].split()[:2] == ["what", "kind"] and table[-1].split()[0] == "total"
    assert any(line.startswith("all_reduce@tp") for line in table)  # gradients or TP
    assert out["# peak memory"].startswith("# peak memory per device: ")


def test_shard_searches_under_a_memory_limit_and_loads_an_edited_plan(tmp_path,
                                                                      capsys) -> None:
    assert main(["shard", str(EXAMPLE), "--mesh", "tp=8", "--memory-limit", "90MiB",
                 "--no-ir"]) == 0
    out = sections(capsys.readouterr().out)
    assert "(limit 0.09 GiB)" in out["# peak memory"]
    plan = Plan.parse(out["# plan"])
    assert plan.strategy == "ilp"
    edited = tmp_path / "edited.plan"
    edited.write_text(plan.text.replace("%l0_down_w: @m[S(0)]", "%l0_down_w: @m[R]")
                      .replace("%l0_down_w: @m[S(1)]", "%l0_down_w: @m[R]"))
    assert main(["shard", str(EXAMPLE), "--plan", str(edited), "--detail"]) == 0
    out = sections(capsys.readouterr().out)
    assert Plan.parse(out["# plan"]) == Plan.parse(edited.read_text())
    assert "%l0_down matmul" in out["# cost"]


def test_propagate_takes_the_files_own_mesh(tmp_path, capsys) -> None:
    path = tmp_path / "annotated.tfir"
    path.write_text("""mesh @m [tp=2]
func @main(%x: f32[4,8] @m[R], %w: f32[8,16] @m[S(1)]) -> (f32[4,16]) {
  %y = matmul(%x, %w) : f32[4,16]
  return(%y)
}
""")
    assert main(["shard", str(path), "--strategy", "propagate"]) == 0
    out = sections(capsys.readouterr().out)
    assert out["# plan"].splitlines()[1:] == ["mesh @m [tp=2]", "%x: @m[R]", "%w: @m[S(1)]"]
    assert "%y = matmul(%x, %w) : f32[4,16] @m[S(1)]" in out["# partitioned IR"]


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "tp=8", "--memory-limit", "lots"], "--memory-limit 'lots': write a size"),
    (["--mesh", "tp"], "write axes as name=size"),
    ([], "declares 0 meshes: give one with --mesh"),
    (["--mesh", "tp=8", "--link", "tp=smoke"], "unknown link class 'smoke'"),
    (["--mesh", "tp=8", "--memory-limit", "1MB"], "ilp: no plan fits the constraints"),
])
def test_bad_arguments_are_named(argv, message, capsys) -> None:
    assert main(["shard", str(EXAMPLE), *argv]) == 1
    assert message in capsys.readouterr().err


def test_explain_on_a_placed_module_names_each_ops_rule_or_says_replicated(tmp_path,
                                                                           capsys) -> None:
    path = tmp_path / "mlp.tfir"
    path.write_text("""mesh @m [dp=2, tp=2]
func @main(%x: f64[6,8] @m[S(0),R], %w: f64[8,16] @m[R,S(1)]) -> (f64[6,16]) {
  %h = matmul(%x, %w) : f64[6,16]
  %c = cumsum(%h) {axis = 0} : f64[6,16]
  return(%c)
}""")
    assert main(["explain", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == ["# sharding: %h: 'matmul' by mk,kn->mn gives [S(0),S(1)]",
                          "# sharding: %c: 'cumsum' has no sharding rule: it runs replicated"]


@pytest.mark.parametrize("pad", [False, True])
def test_shard_pads_an_uneven_split_only_with_pad(pad, tmp_path, capsys) -> None:
    """A hidden width of 30 on tp=4: Megatron splits it only when --pad asks for padding."""
    path = tmp_path / "mlp.tfir"
    path.write_text("""func @main(%x: f32[4,8], %w1: f32[8,30], %w2: f32[30,8]) -> (f32[4,8]) {
  %h = matmul(%x, %w1) : f32[4,30]
  %g = gelu(%h) : f32[4,30]
  %y = matmul(%g, %w2) : f32[4,8]
  return(%y)
}
""")
    argv = ["shard", str(path), "--mesh", "tp=4", "--strategy", "megatron"]
    assert main(argv + (["--pad"] if pad else [])) == 0
    out = sections(capsys.readouterr().out)
    plan = out["# plan"].splitlines()
    assert ("%w1: @m[S(1,pad)]" in plan) == pad and ("%w1: @m[R]" in plan) != pad
    if pad:
        assert "%w2: @m[S(0,pad)]" in plan
        ir = parse_module(out["# partitioned IR"])
        assert str(ir["main"].ops[1].result.type) == "f32[4,30] @m[S(1,pad)]"
        assert str(dict(Plan.parse(out["# plan"]).entries)["w1"][0]) == "S(1,pad)"


SYMBOLIC = """func @main(%x: f32[?batch,8], %w: f32[8,16]) -> (f32[?batch,16]) {
  %y = matmul(%x, %w) : f32[?batch,16]
  return(%y)
}
"""


@pytest.mark.parametrize("bind, rows", [([], 128), (["--bind", "batch=6"], 6)])
def test_shard_plans_a_symbolic_program_for_bound_sizes(bind, rows, tmp_path, capsys) -> None:
    """Splits, costs and memory need sizes: --bind gives them, else 128 with a note."""
    path = tmp_path / "sym.tfir"
    path.write_text(SYMBOLIC)
    assert main(["shard", str(path), "--mesh", "dp=2", "--strategy", "dp", *bind]) == 0
    captured = capsys.readouterr()
    assert ("?batch is not bound: using 128" in captured.err) == (not bind)
    ir = parse_module(sections(captured.out)["# partitioned IR"])
    assert str(ir["main"].args[0].type) == f"f32[{rows},8] @m[S(0)]"
    assert main(["shard", str(path), "--mesh", "dp=2", "--bind", "seq=4"]) == 1
    assert "@main has no dim ?seq (its dims are ?batch)" in capsys.readouterr().err
