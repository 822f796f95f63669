"""The named-target table: every chain ends at generic, features and widths are sane."""

from __future__ import annotations

import pytest

from tilefold.errors import UnsupportedError
from tilefold.target import named_target, target_machine, target_names
from tilefold.target.table import closest_chain

NAMED = [name for name in target_names() if name != "host"]


@pytest.mark.parametrize("name", NAMED)
def test_family_chain_starts_at_itself_and_ends_at_generic(name):
    target = named_target(name)
    assert target.name == name
    assert target.family[0] == name
    assert target.family[-1] == "generic"
    assert all(member in target_names() for member in target.family)


@pytest.mark.parametrize("name", NAMED)
def test_parents_in_a_chain_need_no_more_features_than_the_child(name):
    target = named_target(name)
    for parent in target.family[1:]:
        ancestor = named_target(parent)
        if ancestor.arch == target.arch:
            assert ancestor.features <= target.features, (name, parent)
            assert ancestor.vector_bits <= target.vector_bits


@pytest.mark.parametrize("name", NAMED)
def test_llvm_can_build_a_machine_for_every_named_target(name):
    target = named_target(name)
    assert target_machine(target).triple.startswith(target.arch)
    assert all(item.startswith("+") for item in target.llvm_features().split(","))


def test_isa_levels_have_the_expected_vector_units():
    v3, v4 = named_target("x86-64-v3"), named_target("x86-64-v4")
    assert v3.has("avx2", "fma") and not v3.has("avx512f")
    assert (v3.vector_bits, v3.vector_registers) == (256, 16)
    assert v4.has("avx512f", "avx512bw", "avx512vl")
    assert (v4.vector_bits, v4.vector_registers) == (512, 32)


def test_chips_carry_their_distinctive_features():
    assert named_target("znver4").has("avx512bf16", "avx512vnni", "sse4a")
    assert not named_target("znver4").has("amx-tile")
    assert named_target("sapphirerapids").has("amx-tile", "amx-bf16", "amx-int8", "avx512fp16")
    assert named_target("emeraldrapids").family[1] == "sapphirerapids"
    v1 = named_target("neoverse-v1")
    assert (v1.arch, v1.triple.split("-")[0]) == ("aarch64", "aarch64")
    assert v1.has("neon", "sve", "bf16") and v1.vector_registers == 32
    assert named_target("apple-m1").has("neon") and not named_target("apple-m1").has("sve")


def test_an_unnamed_chip_falls_back_along_the_closest_chip_it_covers():
    """A hypervisor's CPU model may make LLVM name an AMX Xeon "rocketlake": its features still
    reach the sapphirerapids rows (AMX); a chip with fewer features gets the plain ISA levels."""
    spr = named_target("sapphirerapids").features
    assert closest_chain("x86_64", spr | {"serialize"}) == named_target("sapphirerapids").family
    v4 = named_target("x86-64-v4").features
    assert closest_chain("x86_64", v4 | {"avx512vnni"}) == ("x86-64-v4", "x86-64-v3", "generic")
    assert closest_chain("x86_64", spr - {"amx-tile"})[0] == "x86-64-v4"
    assert closest_chain("aarch64", named_target("neoverse-v1").features)[0] == "neoverse-v1"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnsupportedError, match="znver4") as info:
        named_target("pentium-pro")
    assert "pentium-pro" in str(info.value)


def test_aarch64_targets_never_claim_to_run_on_x86_hosts():
    target = named_target("neoverse-v1")
    assert target.is_host() == (named_target("host").arch == "aarch64")
