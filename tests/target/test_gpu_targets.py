"""GPU targets as data: lookup by name, fallback chains, unknown names, device matching."""

from __future__ import annotations

import importlib.util

import pytest

from tilefold.errors import TilefoldError
from tilefold.target import GPUTarget, detect_gpu, gpu_target, gpu_target_names
from tilefold.target.gpu import _entry_for

CHIPS = ["a100", "h100", "h200", "mi300x"]


@pytest.mark.parametrize("name, chain", [
    ("h200", ("h200", "h100", "sm_90", "sm_80")),
    ("h100", ("h100", "sm_90", "sm_80")),
    ("a100", ("a100", "sm_80")),
    ("sm_90", ("sm_90", "sm_80")),
    ("mi300x", ("mi300x", "gfx942")),
])
def test_chains(name, chain):
    assert gpu_target(name).family == chain


@pytest.mark.parametrize("name", gpu_target_names())
def test_every_chain_ends_at_an_architecture_of_one_vendor(name):
    target = gpu_target(name)
    assert target.name == name and target.family[0] == name
    members = [gpu_target(n) for n in target.family]
    root = members[-1]
    assert root.parent is None and root.sm_count is None  # an architecture, not a chip
    assert {m.vendor for m in members} == {target.vendor}
    assert all(m.shared_memory_per_block <= target.shared_memory_per_block for m in members)
    caps = [m.compute_capability for m in members if m.compute_capability is not None]
    assert caps == sorted(caps, reverse=True)


@pytest.mark.parametrize("name", CHIPS)
def test_a_chip_has_every_figure_and_its_architecture_s_units(name):
    chip = gpu_target(name)
    assert chip.sm_count > 0 and chip.l2_bytes > 0 and chip.memory_bandwidth_gbps > 0
    assert chip.memory_bytes > 0 and chip.matrix_tflops > 0
    arch = gpu_target(chip.arch)
    assert arch.name in chip.family and arch.sm_count is None
    assert chip.matrix_dtypes == arch.matrix_dtypes
    assert chip.warp_size == arch.warp_size and chip.compute_capability == arch.compute_capability


def test_published_figures():
    h100, h200, a100, mi = (gpu_target(n) for n in ("h100", "h200", "a100", "mi300x"))
    assert (h100.compute_capability, h100.sm_count, h100.l2_bytes) == ((9, 0), 132, 50 << 20)
    assert h200.memory_bandwidth_gbps == 4800 and h100.memory_bandwidth_gbps == 3350
    assert (h100.matrix_tflops, h100.memory_bytes) == (989, 80 << 30)
    assert (a100.matrix_tflops, h200.memory_bytes, mi.memory_bytes) == (312, 141 << 30, 192 << 30)
    assert a100.sm_count == 108 and a100.shared_memory_per_block == 163 * 1024
    assert h200.has_matrix("fp8e4m3") and not a100.has_matrix("fp8e4m3")
    assert a100.has_matrix("i4") and not h100.has_matrix("i4")
    assert (mi.vendor, mi.arch, mi.warp_size, mi.sm_count) == ("amd", "gfx942", 64, 304)
    assert "h200" in str(h200) and "132 SMs" in str(h200)


def test_unknown_name_is_a_clear_error():
    with pytest.raises(TilefoldError, match=r"no GPU target named 'h300'.*h200.*mi300x"):
        gpu_target("h300")


@pytest.mark.parametrize("device, gcn, cap, want", [
    ("NVIDIA H200", "", (9, 0), "h200"),
    ("NVIDIA H100 80GB HBM3", "", (9, 0), "h100"),
    ("NVIDIA A100-SXM4-80GB", "", (8, 0), "a100"),
    ("NVIDIA GH200 480GB", "", (9, 0), "sm_90"),  # not an h200: the architecture
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", (9, 4), "mi300x"),
    ("AMD Instinct MI300A", "gfx942:sramecc+:xnack-", (9, 4), "gfx942"),
    ("NVIDIA GeForce RTX 3090", "", (8, 6), None),  # 8.6: 99 KB a block, not sm_80's 163
    ("NVIDIA B200", "", (10, 0), None),
])
def test_devices_map_to_their_entry(device, gcn, cap, want):
    entry = _entry_for(device, gcn, cap)
    assert (entry.name if entry is not None else None) == want


def test_detection_is_none_without_a_gpu():
    """PyTorch absent or seeing no GPU: None (this is no detection of the host CPU)."""
    found = detect_gpu()
    torch_sees_gpu = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch_sees_gpu = torch.cuda.is_available()
    assert isinstance(found, GPUTarget) if torch_sees_gpu else found is None
