"""Stream layouts kept on disk: built once from codes and scales mapped from files, then
mapped back (the same bytes and fields, the same products); never for arrays in memory; a
damaged entry or a changed source file builds anew."""

from __future__ import annotations

import os

import numpy as np

from tilefold.codegen.llvm.lowp import weight_only as wo
from tilefold.codegen.llvm.lowp.layout_cache import cached
from tilefold.passes.quantize_weights import quantize_weight
from tilefold.quant import QuantizedTensor, dequantize
from tilefold.target import host_target


def _mapped(tmp_path, rng, seed_shift=0.0):
    w = rng.standard_normal((75, 96)).astype(np.float32) + seed_shift  # [N, K], K grouped
    codes, scale = quantize_weight(w, 1, "int4")
    np.save(tmp_path / "codes.npy", codes.view(np.uint8))
    np.save(tmp_path / "scale.npy", scale)
    return (np.load(tmp_path / "codes.npy", mmap_mode="r").view(codes.dtype),
            np.load(tmp_path / "scale.npy", mmap_mode="r"))


def _layout(sources, builds):
    codes, scale = sources
    target = host_target()
    lanes, decoder = wo.layout_kind("i4", False, target)
    qt = QuantizedTensor.from_codes("int4", np.asarray(codes), 1, np.asarray(scale))

    def build():
        builds.append(1)
        return wo.stream_layout(qt, target)

    return cached(sources, ("int4", 1, lanes, decoder, 2), decoder, build), qt


def test_a_layout_of_mapped_weights_is_kept_and_mapped_back(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path / "cache"))
    sources, builds = _mapped(tmp_path, rng), []
    first, qt = _layout(sources, builds)
    again, _ = _layout(sources, builds)
    assert len(builds) == 1 and isinstance(again.data, np.memmap)
    np.testing.assert_array_equal(again.data, first.data)
    for name in ("k", "n", "tiles", "groups", "chunk_bytes", "code_bytes", "f16_scales"):
        assert getattr(again, name) == getattr(first, name), name
    x = rng.standard_normal((3, 96)).astype(np.float32)
    y = np.empty((3, 75), np.float32)
    wo.prepare_layout(again, 3, 96, 1, None, host_target(), 2).run(x, y)
    want = x.astype(np.float64) @ dequantize(qt, "f64").T
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())

    entries = sorted((tmp_path / "cache" / "layouts").iterdir())
    assert [p.suffix for p in entries] == [".json", ".npy"]
    entries[0].write_text("{not json")  # damaged: built again, and rewritten
    _layout(sources, builds)
    assert len(builds) == 2
    _layout(sources, builds)
    assert len(builds) == 2

    os.utime(tmp_path / "codes.npy", ns=(1, 1))  # a changed source file: a new entry
    _layout(_mapped(tmp_path, rng, 0.5), builds)
    assert len(builds) == 3


def test_weights_in_memory_are_never_kept(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path / "cache"))
    codes, scale = _mapped(tmp_path, rng)
    builds = []
    for _ in range(2):
        _layout((np.array(codes), scale), builds)
    assert len(builds) == 2 and not (tmp_path / "cache" / "layouts").exists()
