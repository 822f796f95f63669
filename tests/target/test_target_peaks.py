"""Measured peaks: the probes run, give positive figures, and are reused from disk."""

from __future__ import annotations

import json

import pytest

import tilefold.target.peaks as peaks
from tilefold.errors import UnsupportedError
from tilefold.target import (
    cache_dir,
    hardware_fingerprint,
    host_target,
    measured_bandwidth_gbps,
    measured_peak_gflops,
    named_target,
)
from tilefold.target.probes import peak_probe, probe_kind


def test_f32_peak_is_measured_then_recalled_from_disk():
    peaks._memory.clear()  # earlier tests in this process may have measured it already
    first = measured_peak_gflops(dtype="f32")
    assert first > 0.1
    recorded = json.loads((cache_dir() / "peaks.json").read_text())[hardware_fingerprint()]
    assert first in recorded.values()
    peaks._memory.clear()
    assert measured_peak_gflops(dtype="f32") == first


@pytest.mark.parametrize("dtype", ["bf16", "int8", "amx-bf16", "amx-int8"])
def test_narrow_type_peaks_where_the_host_has_them(dtype):
    """bf16 and int8 have a ceiling on every x86 host with AVX2 (through f32 or i16 math)."""
    try:
        peak_probe(host_target(), dtype)
    except UnsupportedError:
        assert dtype.startswith("amx") or not host_target().has("avx2")
        pytest.skip(f"host has no {dtype} multiply-accumulate")
    assert measured_peak_gflops(dtype=dtype) > 0.1


def test_probe_kinds_pick_the_right_instructions():
    assert "dpbf16ps.512" in probe_kind(named_target("znver4"), "bf16").call
    assert "vpdpbusd.512" in probe_kind(named_target("znver4"), "int8").call
    assert "v8f32" in probe_kind(named_target("x86-64-v3"), "f32").call
    v3 = named_target("x86-64-v3")
    bf16, int8 = probe_kind(v3, "bf16"), probe_kind(v3, "int8")
    assert "v8f32" in bf16.call and bf16.via == "f32 FMA"  # bf16 widened to f32 on AVX2
    assert "pmadd.wd" in int8.call and int8.via == "i16 pmaddwd"
    with pytest.raises(UnsupportedError, match="int8"):
        probe_kind(named_target("generic"), "int8")
    assert "tdpbf16ps" in peak_probe(named_target("sapphirerapids"), "amx-bf16").ir
    with pytest.raises(UnsupportedError, match="AMX"):
        peak_probe(named_target("znver4"), "amx-int8")


def test_peaks_of_foreign_targets_and_unknown_dtypes_are_refused():
    foreign = "apple-m1" if host_target().arch == "x86_64" else "znver4"
    with pytest.raises(UnsupportedError):
        measured_peak_gflops(named_target(foreign))
    with pytest.raises(UnsupportedError, match="dtype"):
        measured_peak_gflops(dtype="f64")


def test_read_bandwidth_is_positive(monkeypatch, tmp_path):
    # A small stream is quick but cache-resident: keep its figure out of the shared records.
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peaks, "_memory", {})
    monkeypatch.setattr(peaks, "_stream_bytes", lambda l3: 16 << 20)
    assert measured_bandwidth_gbps(threads=2) > 0.1


def test_refresh_keeps_the_best_figure_ever_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peaks, "_memory", {})
    measured = measured_peak_gflops(dtype="f32")
    (key,) = peaks._memory
    peaks._remember(key, 1e9)  # as if an earlier, quieter probe had seen this much
    assert measured_peak_gflops(dtype="f32", refresh=True) == 1e9
    assert peaks._remember(key, measured) == 1e9


@pytest.mark.parametrize("streams, unroll, prefetch", peaks.READ_FORMS)
def test_read_probe_reads_every_vector_once(streams, unroll, prefetch):
    """The probe's sum over `streams` sections equals NumPy's: no vector skipped or read twice."""
    import ctypes

    import numpy as np

    from tilefold.target.probe_jit import probe_function
    from tilefold.target.probes import read_probe_ir

    target = host_target()
    lanes = target.vector_bits // 32
    blocks = 37
    data = np.random.default_rng(0).integers(0, 8, (streams * unroll * blocks, lanes))
    data = data.astype(np.float32)  # small integers: every partial sum exact
    read = probe_function(read_probe_ir(target, streams, unroll, prefetch), target, "read",
                          ctypes.c_float, ctypes.c_void_p, ctypes.c_int64)
    assert read(data.ctypes.data, blocks) == data[:, 0].sum()
