"""Host detection: plausible fields, narrowing to an ISA level, cache dir and fingerprint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tilefold.errors import UnsupportedError
from tilefold.target import cache_dir, hardware_fingerprint, host_target, named_target


def test_host_fields_are_plausible():
    host = host_target()
    assert host.arch in ("x86_64", "aarch64")
    assert host.cpu and host.name == host.cpu and host.triple.startswith(host.arch)
    assert host.vector_bits in (128, 256, 512)
    assert host.vector_registers in (16, 32)
    assert 8 * 1024 <= host.l1d_bytes <= 1024 * 1024
    assert host.l1d_bytes < host.l2_bytes
    assert host.l3_bytes > 0
    assert host.cores == len(os.sched_getaffinity(0))
    assert host.family[0] == host.name and host.family[-1] == "generic"
    assert host.is_host()
    if host.arch == "x86_64":
        assert host.has("sse2")
        assert host.vector_bits == (512 if host.has("avx512f") else 256 if host.has("avx") else 128)


def test_named_host_is_the_detected_host():
    assert named_target("host") is host_target()


def test_host_family_only_lists_levels_the_host_can_run():
    host = host_target()
    for member in host.family[1:]:
        assert named_target(member).features <= host.features


def test_narrowing_to_avx2_keeps_the_host_memory_hierarchy():
    host = host_target()
    if not host.has("avx2", "fma"):
        pytest.skip("host has no AVX2")
    narrowed = host_target("x86-64-v3")
    assert narrowed.cpu == "x86-64-v3" and narrowed.vector_bits == 256
    assert not narrowed.has("avx512f")
    assert (narrowed.l1d_bytes, narrowed.l2_bytes, narrowed.cores) == (
        host.l1d_bytes,
        host.l2_bytes,
        host.cores,
    )
    assert narrowed.is_host()


def test_narrowing_to_a_foreign_isa_is_refused():
    foreign = "neoverse-v1" if host_target().arch == "x86_64" else "x86-64-v3"
    with pytest.raises(UnsupportedError, match="cannot narrow"):
        host_target(foreign)


def test_host_llvm_features_switch_off_what_the_cpu_lacks():
    host = host_target()
    text = host.llvm_features()
    assert all(f"+{feature}" in text for feature in host.features)
    assert all(f"-{feature}" in text for feature in host.disabled_features)


def test_fingerprint_is_stable_hex():
    fingerprint = hardware_fingerprint()
    assert fingerprint == hardware_fingerprint()
    int(fingerprint, 16)


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("TILEFOLD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "tilefold"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "tilefold"


def test_tilefold_host_makes_the_machine_act_as_a_weaker_target(monkeypatch):
    real = host_target("host")  # the machine itself, whatever TILEFOLD_HOST says
    weaker = "x86-64-v3" if real.arch == "x86_64" and real.has("avx2", "fma") else "generic"
    monkeypatch.setenv("TILEFOLD_HOST", weaker)
    forced = host_target()
    assert forced.name == weaker and forced.family[0] == weaker
    assert forced.features <= real.features
    assert (forced.l2_bytes, forced.cores) == (real.l2_bytes, real.cores)
    assert forced.is_host()
    assert host_target("host").name == real.name  # an explicit "host" is the machine itself


def test_an_unknown_tilefold_host_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TILEFOLD_HOST", "pentium-pro")
    with pytest.raises(UnsupportedError, match="TILEFOLD_HOST"):
        host_target()
