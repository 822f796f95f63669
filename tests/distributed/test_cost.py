"""The alpha-beta cost model: ring collectives' bytes and times, Megatron's bytes per layer
(8(t-1)/t * b*s*h*e for a training step), redistribute priced as expand-redistribute expands
it, roofline compute, peak memory, and the breakdown table."""

from __future__ import annotations

import pytest

from tilefold.codegen.lower import RULES, op_flops
from tilefold.distributed import (
    AlphaBeta,
    BlockShape,
    Constraints,
    CostModelError,
    gpt2,
    llama,
    nbytes,
    plan_cost,
    search,
)
from tilefold.distributed.cost import DEVICES, LINKS, DeviceSpec, device_spec
from tilefold.distributed.plan import parse_mesh
from tilefold.errors import TilefoldError
from tilefold.ir import parse_module, verify
from tilefold.ir.types import parse_placements
from tilefold.passes import run_pipeline
from tilefold.target.gpu import GPU_TARGETS


@pytest.mark.parametrize("t", [2, 4, 8])
def test_ring_collectives_move_the_textbook_bytes(t) -> None:
    mesh = parse_mesh(f"tp={t}")
    model = AlphaBeta(mesh, links={"tp": "ib"})
    b = 3 * 2**20
    ib = LINKS["ib"]
    ar = model.collective("all_reduce", b, "tp")
    assert ar.comm_bytes == 2 * (t - 1) * b / t
    assert ar.seconds == pytest.approx(2 * (t - 1) * ib.alpha + 2 * (t - 1) / t * b * ib.beta,
                                       rel=1e-12)
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert model.collective(kind, b, "tp").comm_bytes == (t - 1) * b / t
    assert model.collective("local_slice", b, "tp").seconds == 0.0


@pytest.mark.parametrize("t, layers, shape", [
    (2, 1, BlockShape(d=64, heads=4, batch=2, seq=8)),
    (4, 2, BlockShape(d=128, heads=8, batch=4, seq=16)),
    (8, 3, BlockShape(d=256, heads=8, batch=2, seq=32, dtype="bf16")),
])
def test_megatron_bytes_per_layer_are_8_t_minus_1_over_t_bshe(t, layers, shape) -> None:
    shape = BlockShape(**{**shape.__dict__, "layers": layers})
    mesh = parse_mesh(f"tp={t}")
    model = AlphaBeta(mesh)
    e = {"f32": 4, "bf16": 2}[shape.dtype]
    bshe = shape.batch * shape.seq * shape.d * e
    for block in (gpt2, llama):
        module = block(shape)
        for strategy in ("megatron", "megatron-sp"):
            plan = search(module, mesh, strategy, model)
            _, train = plan_cost(plan, module, model, Constraints(training=True))
            _, forward = plan_cost(plan, module, model)
            assert forward.comm_bytes == layers * 4 * (t - 1) * bshe / t
            # a training step: forward, then each collective's conjugate; gradients of the
            # replicated weights are complete on every tp rank (no all_reduce for them)
            comm = sum(i.bytes for i in train.items if not i.what.startswith("grad"))
            assert comm == layers * 8 * (t - 1) * bshe / t
            grads = [i for i in train.items if i.what.startswith("grad")]
            assert (not grads) if strategy == "megatron" else grads


def test_a_redistribute_costs_what_its_expansion_costs() -> None:
    text = """mesh @m [a=2, b=4]
func @main(%x: f32[64,32] @m[S(0),S(1)]) -> (f32[64,32] @m[R,R]) {
  %y = redistribute(%x) {placements = "[S(1),S(0)]"} : f32[64,32] @m[S(1),S(0)]
  %z = redistribute(%y) {placements = "[R,R]"} : f32[64,32] @m[R,R]
  return(%z)
}"""
    module = verify(parse_module(text))
    model = AlphaBeta(module.meshes["m"], links={"a": "ib", "b": "nvlink"})
    before = model.estimate(module["main"])
    run_pipeline(module, "expand-redistribute")
    after = model.estimate(verify(module)["main"])
    assert [i.kind for i in after.items] == ["all_gather@a", "all_to_all@b", "local_slice@a",
                                            "all_gather@a", "all_gather@b"]
    assert before.seconds == pytest.approx(after.seconds, rel=1e-12)
    # blocks of 64x32 f32 (8192 bytes): gather [64,8] over a, all_to_all [64,8] over b,
    # gather [16,32] over a, gather the whole over b
    assert before.comm_bytes == after.comm_bytes == 1024 + 1536 + 1024 + 6144
    x = module["main"].args[0].type
    direct = model.redistribute(x, parse_placements("[S(1),S(0)]"))
    assert direct.comm_bytes == 2048 / 2 + 2048 * 3 / 4


def test_compute_is_a_roofline_on_the_local_blocks() -> None:
    text = """mesh @m [tp=4]
func @main(%x: f32[512,256] @m[R], %w: f32[256,1024] @m[S(1)]) -> (f32[512,1024] @m[S(1)]) {
  %y = matmul(%x, %w) : f32[512,1024] @m[S(1)]
  %g = gelu(%y) : f32[512,1024] @m[S(1)]
  return(%g)
}"""
    module = verify(parse_module(text))
    model = AlphaBeta(module.meshes["m"])
    mm, gelu = (model.compute(op) for op in module["main"].ops[:2])
    assert mm.flops == 2 * 512 * 256 * 256
    moved = (512 * 256 + 256 * 256 + 512 * 256) * 4
    d = model.device
    assert mm.seconds == max(mm.flops / d.flops, moved / d.bandwidth)
    assert gelu.flops == op_flops("gelu") * 512 * 256  # the lowering table's: one count
    assert gelu.seconds == max(gelu.flops / d.flops, 2 * 512 * 256 * 4 / d.bandwidth)
    # arguments stay; %y lives until gelu has read it
    assert model.peak_memory(module["main"]) == (512 * 256 + 256 * 256 + 2 * 512 * 256) * 4
    table = (mm + gelu).table()
    assert table.splitlines()[0].split() == ["what", "kind", "GFLOP", "MB", "moved", "ms"]
    assert table.splitlines()[-1].split()[0] == "total"
    assert "%y matmul" in (mm + gelu).table(detail=True)


@pytest.mark.parametrize("name", ["gelu", "softmax", "log_softmax", "layer_norm", "rms_norm",
                                  "exp", "add", "where"])
def test_an_op_costs_the_flops_its_lowering_rule_gives(name: str) -> None:
    """Per result element, the flops the kernels' cost model charges (`codegen/lower/rules.py`),
    not a second table."""
    operands = {"where": "%c, %x, %x", "layer_norm": "%x, %g, %g", "rms_norm": "%x, %g"}
    text = f"""mesh @m [tp=2]
func @main(%x: f32[8,6] @m[S(0)], %c: bool[8,6] @m[S(0)], %g: f32[6] @m[R])
    -> (f32[8,6] @m[S(0)]) {{
  %y = {name}({operands.get(name, "%x")}) : f32[8,6] @m[S(0)]
  return(%y)
}}"""
    module = verify(parse_module(text.replace("add(%x)", "add(%x, %x)")))
    (op,) = [o for o in module["main"].ops if o.name == name]
    assert name in RULES
    assert AlphaBeta(module.meshes["m"]).compute(op).flops == RULES[name].flops * 4 * 6


def test_devices_are_the_gpu_targets_chips() -> None:
    """One hardware model: each GPU device's roofline is its `target/gpu.py` entry's."""
    chips = [t for t in GPU_TARGETS.values() if t.sm_count is not None]
    assert set(DEVICES) == {t.name for t in chips} | {"cpu"}
    for t in chips:
        d = DEVICES[t.name]
        assert (d.flops, d.bandwidth, d.memory) == (t.matrix_tflops * 1e12,
                                                    t.memory_bandwidth_gbps * 1e9, t.memory_bytes)
    assert DEVICES["h100"] == DeviceSpec("h100", 989e12, 3.35e12, 80 << 30)  # as it was typed
    with pytest.raises(TilefoldError, match=r"sm_90 .* is an architecture"):
        device_spec(GPU_TARGETS["sm_90"])


def test_default_links_follow_the_node_boundary() -> None:
    model = AlphaBeta(parse_mesh("dp=4,tp=8"))
    assert model.links == {"dp": LINKS["ib"], "tp": LINKS["nvlink"]}
    assert nbytes(parse_module("mesh @m [tp=2]\nfunc @main(%x: bf16[8,6] @m[S(0)]) -> "
                               "(bf16[8,6]) { return(%x) }")["main"].args[0].type) == 48


def test_bad_links_and_axes_are_named() -> None:
    mesh = parse_mesh("tp=2")
    with pytest.raises(CostModelError, match="unknown link class 'pcie'; known: nvlink"):
        AlphaBeta(mesh, links={"tp": "pcie"})
    with pytest.raises(CostModelError, match=r"links name axes \['dp'\]"):
        AlphaBeta(mesh, links={"dp": "ib"})
    with pytest.raises(CostModelError, match="axis 'dp'"):
        AlphaBeta(mesh).collective("all_reduce", 8, "dp")
    with pytest.raises(CostModelError, match="no alpha-beta price for collective 'gossip'"):
        AlphaBeta(mesh).collective("gossip", 8, "tp")


@pytest.mark.parametrize("shape, start", [
    ((96, 40, 6), "[S(0),S(1),R]"), ((12, 8, 10), "[P(sum),S(0),S(2)]"), ((8, 8, 8), "[R,R,R]")])
def test_paths_to_every_target_are_the_pass_paths_and_depend_on_divisibility_only(
        shape, start) -> None:
    from math import gcd

    from tilefold.distributed.cost import steps
    from tilefold.ir.types import Mesh, Sharding, TensorType
    from tilefold.passes.expand_redistribute import redistribute_paths, redistribute_steps

    mesh = Mesh.of("m", a=2, b=2, c=3)
    t = TensorType.of("f32", shape).with_sharding(Sharding(mesh, parse_placements(start)))
    paths = redistribute_paths(t)
    assert len(paths) > 10
    for target, path in paths.items():
        assert redistribute_steps(t, target) == path == steps(t, target)
    small = t.with_shape([gcd(d, mesh.size) for d in shape]).with_sharding(t.sharding)
    assert redistribute_paths(small) == paths
