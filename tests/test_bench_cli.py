"""`tilefold bench gemm|lowp` end to end on tiny shapes, one round (smoke runs, not benchmarks:
the peak and bandwidth probes are replaced by constants)."""

from __future__ import annotations

import json

import pytest

import tilefold.target
from tilefold.cli import bench_gemm
from tilefold.cli.main import main

TINY = ["--rounds", "1", "--threads", "1", "--block-seconds", "0.001"]


@pytest.fixture(autouse=True)
def _no_probes(monkeypatch):
    """The suites re-probe the machine's peaks (a timing run); a smoke run takes constants."""
    monkeypatch.setattr(tilefold.target, "measured_peak_gflops", lambda **kw: 50.0)
    monkeypatch.setattr(tilefold.target, "measured_bandwidth_gbps", lambda threads: 20.0)


def _contenders(data: dict) -> list[dict]:
    return [c for s in data["sections"] for r in s["rows"] for c in r["contenders"].values()]


def test_gemm_names_the_blas_and_reports_interleaved_and_alone(tmp_path, capsys):
    out = tmp_path / "gemm.json"
    argv = ["bench", "gemm", "--shape", "17x9x33", "--shape", "2x8x16x4", "--no-torch",
            "--no-compile-times", *TINY, "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "numpy: openblas" in text and "interleaved/alone" in text and "vs numpy" in text
    data = json.loads(out.read_text())
    assert data["suite"] == "gemm" and data["numpy_blas"]["internal_api"]
    (section,) = data["sections"]
    assert (section["peak"], section["threads"]) == (50.0, 1)
    assert [r["case"] for r in section["rows"]] == ["17x9x33", "2x8x16x4"]
    assert all(r["max_rel_err"] < 1e-5 for r in section["rows"])  # vs float64 NumPy
    for c in _contenders(data):
        assert c["interleaved_s"] > 0 and c["alone_s"] > 0
        assert c["slowed"] == (c["interleaved_s"] > 1.1 * c["alone_s"])


def test_gemm_compile_times_read_both_fresh_processes(monkeypatch):
    runs = {"cold": "rows avx2_6x16 120.5\ngemv avx2_gemv 30.0\n",
            "cached": "rows avx2_6x16 2.5\ngemv avx2_gemv 1.0\n"}
    monkeypatch.setattr(bench_gemm, "fresh_process_runs", lambda *a, **kw: runs)
    assert bench_gemm.compile_times() == {
        "rows": {"kernel": "avx2_6x16", "cold": 120.5, "cached": 2.5},
        "gemv": {"kernel": "avx2_gemv", "cold": 30.0, "cached": 1.0}}


def test_lowp_weight_only_gemv_counts_each_contenders_own_bytes(tmp_path, capsys):
    out = tmp_path / "lowp.json"
    assert main(["bench", "lowp", "--dtype", "int4", "--shape", "1x64x64", *TINY,
                 "--json", str(out)]) == 0
    assert "weight-only GEMV" in capsys.readouterr().out
    (section,) = json.loads(out.read_text())["sections"]
    (row,) = section["rows"]
    tf, fp32 = row["contenders"]["tilefold"], row["contenders"]["fp32"]
    assert fp32["GB/s"] == pytest.approx(64 * 64 * 4 / fp32["interleaved_s"] / 1e9)
    assert tf["GB/s"] * tf["interleaved_s"] < fp32["GB/s"] * fp32["interleaved_s"] / 4
    assert section["geomean"]["fp32"] == pytest.approx(
        fp32["interleaved_s"] / tf["interleaved_s"])


def test_lowp_int8_gemm_runs_against_tilefolds_own_fp32(tmp_path):
    out = tmp_path / "int8.json"
    assert main(["bench", "lowp", "--dtype", "int8", "--shape", "32x16x64", *TINY,
                 "--json", str(out)]) == 0
    (section,) = json.loads(out.read_text())["sections"]
    names = set(section["rows"][0]["contenders"])
    assert {"tilefold", "tf_unpacked_b", "fp32"} <= names
    assert section["unit"] == "GOP/s"


def test_lowp_leaves_out_a_peer_that_runs_the_type_in_software():
    """A peer far slower than tilefold's own fp32 GEMM on the small probe (here one that
    sleeps) is named in a note and not timed; a fast one stays."""
    import time

    import numpy as np

    from tilefold.cli.bench_lowp import _without_emulated
    from tilefold.cli.benchutil import Shape

    notes = []

    class Notes:
        def note(self, text):
            notes.append(text)

    def peers(a, b, threads):
        return {"emulated": lambda: time.sleep(0.05), "native": lambda: a @ b}

    a, b = (np.ones((64, 64), np.float32) for _ in range(2))
    kept = _without_emulated(peers, a, b, a, b, 1, Shape("64x64x64", 1, 64, 64, 64), Notes())
    assert set(kept) == {"native"}
    (note,) = notes
    assert "emulated left out" in note and "64x64x64" in note


def test_memory_bound_kernels_and_call_overhead(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFOLD_NUM_THREADS", "1")  # the suite sets it for the process
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    out = tmp_path / "memory.json"
    try:
        assert main(["bench", "memory", "--only", "rms_norm", "--big-rows", "24", "--rounds", "1",
                     "--threads", "1", "--no-torch-compile", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(before)
    kernels, overhead = json.loads(out.read_text())["sections"]
    assert [r["case"] for r in kernels["rows"]] == ["rms_norm-512x4096", "rms_norm-24x2048"]
    assert all(r["max_rel_err"] < 1e-5 for r in kernels["rows"])  # vs float64 NumPy
    assert (kernels["unit"], kernels["peak"], overhead["unit"]) == ("GB/s", 20.0, "us")
    for row in kernels["rows"]:
        tf = row["contenders"]["tilefold"]
        assert tf["GB/s"] == pytest.approx(row["bytes"] / tf["interleaved_s"] / 1e9)
    assert set(overhead["rows"][0]["contenders"]) == {"tilefold", "numpy", "eager"}
