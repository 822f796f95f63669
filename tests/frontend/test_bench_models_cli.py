"""`tilefold bench models`: a one-layer BERT end to end, its JSON, the ORT column and the plot."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tilefold.cli.main import main

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TINY = ["bench", "models", "--models", "bert", "--layers", "1", "--batch", "1", "--seq", "8",
        "--rounds", "1", "--threads", "1", "--no-inductor"]


pytestmark = pytest.mark.usefixtures("restore_threads")


def _run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "models.json"
    assert main([*TINY, "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def _check_common(data: dict) -> dict:
    assert (data["batch"], data["seq"], data["layers"], data["rounds"], data["threads"]) == \
        (1, 8, 1, 1, 1)
    assert list(data["models"]) == ["bert"]
    bert = data["models"]["bert"]
    assert bert["params"] > 0 and bert["kernel_methods"]
    rows = bert["contenders"]
    assert "torch.compile (inductor)" not in rows
    for row in rows.values():
        assert row["latency"] > 0 and row["latency_alone"] > 0 and row["speedup_vs_eager"] > 0
    tf = rows["tilefold"]
    assert tf["cold"] >= 0 and tf["warm"] >= 0
    assert 0 <= tf["max_abs_error"] < 1e-3  # checked against eager
    assert rows["PyTorch eager"]["speedup_vs_eager"] == 1.0
    (section,) = data["sections"]
    (row,) = section["rows"]
    assert row["case"] == "bert" and set(row["contenders"]) == set(rows)
    for name, timing in row["contenders"].items():
        assert timing["interleaved_s"] == rows[name]["latency"]
        assert timing["alone_s"] == rows[name]["latency_alone"]
        assert timing["slowed"] == (timing["interleaved_s"] > 1.1 * timing["alone_s"])
    assert section["geomean"]["PyTorch eager"] == pytest.approx(
        rows["PyTorch eager"]["latency"] / tf["latency"])
    return bert


def test_without_ort(tmp_path, capsys):
    bert = _check_common(_run(tmp_path, "--no-ort"))
    assert set(bert["contenders"]) == {"tilefold", "PyTorch eager"}
    out = capsys.readouterr().out
    assert "ONNX Runtime skipped: --no-ort" in out
    assert "tilefold" in out and "PyTorch eager" in out and "vs PyTorch eager" in out


def test_with_ort_and_plot(tmp_path, capsys):
    plot = tmp_path / "models.png"
    data = _run(tmp_path, "--plot", str(plot))
    bert = _check_common(data)
    out = capsys.readouterr().out
    if importlib.util.find_spec("onnxruntime") is None:
        assert "ONNX Runtime" not in bert["contenders"]
        assert "onnxruntime is not installed" in out
    else:
        assert not bert["skipped"], bert["skipped"]
        ort = bert["contenders"]["ONNX Runtime"]
        assert ort["cold"] >= 0 and 0 <= ort["max_abs_error"] < 1e-3
        assert data["sections"][0]["geomean"]["ONNX Runtime"] == pytest.approx(
            ort["latency"] / bert["contenders"]["tilefold"]["latency"])
        assert "vs ONNX Runtime" in out
    assert plot.exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_unknown_model_is_an_error(capsys):
    assert main(["bench", "models", "--models", "bert,t5"]) == 1
    assert "unknown model(s) t5; choose from minilm,bert,gpt2,llama" in capsys.readouterr().err
