"""`tilefold bench aot`'s plumbing on a one-layer BERT (no timing asserted): every contender
built, started in new processes and timed; its JSON; a peer left out is reported absent."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from tilefold.cli.aot_peers import AOTI, JIT, ORT, TILEFOLD, TILEFOLD_C
from tilefold.cli.main import main

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TINY = ["bench", "aot", "--model", "tiny", "--batch", "2", "--seq", "8", "--starts", "2",
        "--rounds", "1", "--threads", "1"]
HAS_ORT = all(importlib.util.find_spec(m) for m in ("onnxruntime", "onnx"))

pytestmark = pytest.mark.usefixtures("restore_threads")


@pytest.fixture(scope="module")
def everything(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench_aot") / "aot.json"
    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:  # the bench sets both thread counts
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(out.parent / "inductor"))
        mp.setenv("TILEFOLD_NUM_THREADS", "1")
        try:
            assert main([*TINY, "--json", str(out)]) == 0
        finally:
            torch.set_num_threads(before)
    return json.loads(out.read_text())["aot"]


def test_every_contender_is_built_started_and_timed(everything) -> None:
    aot = everything
    assert (aot["model"], aot["batch"], aot["seq"], aot["threads"]) == ("tiny", 2, 8, 1)
    built = [TILEFOLD, AOTI] + ([ORT] if HAS_ORT else [])
    assert sorted(aot["sizes"]) == sorted(built)
    for name in built:
        size = aot["sizes"][name]
        assert size["total_bytes"] == sum(size["files"].values()) > 0
        assert size["beyond_weights_bytes"] == size["total_bytes"] - aot["weights_bytes"]
    tf = aot["sizes"][TILEFOLD]
    assert tf["code_bytes"] == tf["total_bytes"] - tf["files"]["data.bin"] > 0
    assert aot["sizes"][AOTI]["code_bytes"] is None  # its weights are inside its library
    if HAS_ORT:
        assert 0 < aot["sizes"][ORT]["code_bytes"] < aot["sizes"][ORT]["total_bytes"]
    started = built + ([TILEFOLD_C] if shutil.which("cc") else [])
    assert sorted(aot["starts"]) == sorted(started)
    for start in aot["starts"].values():
        assert start["first_result_s"] > 0 and start["steady_s"] > 0
        assert 1 << 20 < start["peak_rss_bytes"] < 1 << 34  # this process's, not inherited
    assert sorted(aot["steady"]) == sorted([*built, JIT])
    for name, error in aot["max_abs_error_vs_eager"].items():
        assert error < 1e-4, name  # each artifact computes the model
    assert aot["ratios"][f"steady vs {JIT}"] == pytest.approx(
        aot["steady"][TILEFOLD]["interleaved_s"] / aot["steady"][JIT]["interleaved_s"])
    assert aot["ratios"][f"total bytes vs {AOTI}"] == pytest.approx(
        aot["sizes"][TILEFOLD]["total_bytes"] / aot["sizes"][AOTI]["total_bytes"])


def test_the_python_start_imports_no_torch_for_tilefold(everything) -> None:
    """The tilefold artifact's new process needs far less memory than AOTInductor's, which
    imports torch (a plumbing check: the right loader ran in each)."""
    starts = everything["starts"]
    assert starts[TILEFOLD]["peak_rss_bytes"] < starts[AOTI]["peak_rss_bytes"] / 2


def test_a_peer_left_out_is_reported_absent(tmp_path, capsys) -> None:
    out = tmp_path / "aot.json"
    assert main([*TINY, "--no-inductor", "--no-ort", "--no-c", "--json", str(out)]) == 0
    aot = json.loads(out.read_text())["aot"]
    assert aot["absent"] == {AOTI: "--no-inductor", ORT: "--no-ort"}
    assert sorted(aot["sizes"]) == [TILEFOLD] and sorted(aot["starts"]) == [TILEFOLD]
    assert f"{AOTI} absent: --no-inductor" in capsys.readouterr().out
