"""`tilefold tune --comm`: all_reduce timed on 2 local gloo ranks, the ring alpha-beta model
fitted, kept per machine, and predicting a 16 MiB all_reduce within 2x of its measured time."""

from __future__ import annotations

import numpy as np
import pytest

from tilefold.cli.main import main
from tilefold.distributed import calibrate
from tilefold.distributed.cost import AlphaBeta, CostModelError
from tilefold.ir.types import Mesh

pytest.importorskip("torch.distributed")


def test_fit_recovers_a_known_ring():
    """Times made by the model itself (alpha 0.2 ms, 1.1 GB/s) give its constants back."""
    sizes = [1 << p for p in range(10, 25, 2)]
    alpha, beta = 2e-4, 1 / 1.1e9
    for world in (2, 4):
        times = [2 * (world - 1) * alpha + 2 * (world - 1) / world * s * beta for s in sizes]
        got = calibrate.fit_ring(sizes, times, world)
        np.testing.assert_allclose(got, (alpha, beta), rtol=1e-9)


def _calibrate(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    assert calibrate.measured("gloo", 2) is None
    assert main(["tune", "--comm", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "GB/s" in out
    cal = calibrate.measured("gloo", 2)
    assert cal is not None and cal.alpha > 0 and cal.beta > 0
    return cal


def test_calibration_is_kept_and_prices_the_measured_link(tmp_path, monkeypatch, capsys):
    """tune --comm fits positive constants, keeps them per machine, and the cost model's
    'measured' link prices a collective with exactly that fit."""
    cal = _calibrate(tmp_path, monkeypatch, capsys)
    predicted = cal.all_reduce_seconds(16 << 20)
    assert predicted == pytest.approx(2 * cal.alpha + (16 << 20) * cal.beta, rel=1e-12)
    model = AlphaBeta(Mesh("m", (("tp", 2),)), links={"tp": "measured"})
    est = model.collective("all_reduce", 16 << 20, "tp")
    assert est.seconds == pytest.approx(predicted, rel=1e-12)


@pytest.mark.timing
def test_calibrated_model_predicts_a_16_mib_all_reduce(tmp_path, monkeypatch, capsys):
    """Speed-dependent (TILEFOLD_TIMING_TESTS=1): a neighbour on a shared host slows the
    calibration or the fresh run by more than 2x now and then (CI saw 2.5x)."""
    cal = _calibrate(tmp_path, monkeypatch, capsys)
    predicted = cal.all_reduce_seconds(16 << 20)
    # The fit holds the calibration's own 16 MiB time...
    assert 0.5 <= predicted / cal.seconds[cal.sizes.index(16 << 20)] <= 2.0
    # ...and a fresh one: the best of three runs, since noise only adds time
    measured = min(calibrate.measure_all_reduce(2, "gloo", sizes=(16 << 20,), rounds=5)[0]
                   for _ in range(3))
    assert 0.5 <= predicted / measured <= 2.0, (predicted, measured)


def test_the_measured_link_needs_tune_comm(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFOLD_CACHE_DIR", str(tmp_path))
    with pytest.raises(CostModelError, match="tune --comm"):
        AlphaBeta(Mesh("m", (("tp", 2),)), links={"tp": "measured"})


def test_one_rank_is_a_clear_error():
    with pytest.raises(calibrate.CalibrationError, match="at least 2 ranks"):
        calibrate.calibrate(1)
